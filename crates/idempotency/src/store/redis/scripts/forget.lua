--[[
  Forgets an idempotency record for an operator: deletes the key KEYS[1] if the record
  is still as the operator read it (same status, expiration, lease end and lease token),
  so a claim or completion made since is never deleted.

  Input:
    KEYS[1] the record's key (a hash)

    ARGV[1] the status read
    ARGV[2] the expiration read (epoch seconds)
    ARGV[3] the lease end read (epoch milliseconds), or '' for none
    ARGV[4] the lease token read, or '' for none

  Output:
    1 deleted
    0 the record changed since it was read: nothing deleted
   -1 no record
]]
local r = redis.call('HMGET', KEYS[1], 'status', 'expiration', 'in_progress_expiration', 'lease_token')
if not r[1] and redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local function same_number(stored, read)
  if read == '' then return not stored end
  return stored and tonumber(stored) == tonumber(read)
end
if r[1] ~= ARGV[1] or not same_number(r[2], ARGV[2]) or not same_number(r[3], ARGV[3])
  or (r[4] or '') ~= ARGV[4] or (ARGV[4] == '' and r[4]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
