--[[
  Releases an idempotency record: deletes the key KEYS[1] if the record still holds the
  caller's lease token, so a later delivery may claim it at once.

  Input:
    KEYS[1] the record's key (a hash)

    ARGV[1] the claim's lease token

  Output:
    1 deleted
    0 the lease token differs or the record is gone: nothing deleted
]]
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
