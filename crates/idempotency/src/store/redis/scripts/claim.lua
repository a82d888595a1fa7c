--[[
  Claims an idempotency record: replaces the hash at KEYS[1] with a new in-progress
  record if the old one is claimable (free; in progress under this lease token; in
  progress with its lease ended, unless the claim is at-most-once, which waits for the
  expiry too; or expired without a lease), and returns the old hash
  either way, in the same round trip. Times are the caller's: the server's clock plays
  no part.

  Input:
    KEYS[1] the record's key (a hash)

    ARGV[1] now, epoch milliseconds
    ARGV[2] now, epoch seconds
    ARGV[3] the new record's expiration, epoch seconds
    ARGV[4] the new lease's end, epoch milliseconds
    ARGV[5] the claim's lease token
    ARGV[6] '1' if a validation hash follows, '0' if not
    ARGV[7] the validation hash (empty if ARGV[6] is '0')
    ARGV[8] the key's expiry (PEXPIREAT), epoch milliseconds
    ARGV[9] '1' if the claim is at-most-once (never takes over a lapsed lease), '0' if not

  Output:
    {1, old} claimed: the record was written
    {0, old} refused: a live record holds the key, left as it was
    old is the hash that was there, flat (field, value, ...), empty if there was none
]]
local old = redis.call('HGETALL', KEYS[1])
if #old > 0 then
  local r = {}
  for i = 1, #old, 2 do r[old[i]] = old[i + 1] end
  local lease = tonumber(r['in_progress_expiration'])
  local claimable
  if r['status'] == 'INPROGRESS' and r['lease_token'] == ARGV[5] then
    claimable = true
  elseif r['status'] == 'INPROGRESS' and lease then
    claimable = lease < tonumber(ARGV[1])
    if ARGV[9] == '1' then
      local expiration = tonumber(r['expiration'])
      claimable = claimable and expiration ~= nil and expiration < tonumber(ARGV[2])
    end
  else
    local expiration = tonumber(r['expiration'])
    claimable = expiration ~= nil and expiration < tonumber(ARGV[2])
  end
  if not claimable then return {0, old} end
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'status', 'INPROGRESS', 'expiration', ARGV[3],
  'in_progress_expiration', ARGV[4], 'lease_token', ARGV[5])
if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'validation', ARGV[7]) end
redis.call('PEXPIREAT', KEYS[1], ARGV[8])
return {1, old}
