--[[
  Completes an idempotency record: if the record at KEYS[1] still holds the caller's
  lease token, sets it COMPLETED with its result (or none) and its new expiration, and
  moves the key's expiry. A record that is gone is not created again.

  Input:
    KEYS[1] the record's key (a hash)

    ARGV[1] the claim's lease token
    ARGV[2] the record's expiration, epoch seconds
    ARGV[3] the key's expiry (PEXPIREAT), epoch milliseconds
    ARGV[4] '1' if a result follows, '0' if not
    ARGV[5] the result (empty if ARGV[4] is '0')

  Output:
    1 completed
    0 the lease token differs or the record is gone: nothing written
]]
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'COMPLETED', 'expiration', ARGV[2])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'data', ARGV[5])
else
  redis.call('HDEL', KEYS[1], 'data')
end
redis.call('PEXPIREAT', KEYS[1], ARGV[3])
return 1
