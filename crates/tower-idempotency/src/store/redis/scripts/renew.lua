-- KEYS[1] record; ARGV: token, lease ms. Runs after prologue.lua.
local rec = redis.call('HMGET', KEYS[1], 'token', 'state')
if rec[1] ~= ARGV[1] or rec[2] ~= 'running' then return 0 end
local lease_until = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lease_until', lease_until)
-- A live holder's record does not expire: its expiry is kept at or past the lease.
local expires_at = tonumber(redis.call('HGET', KEYS[1], 'expires_at'))
if not expires_at or expires_at < lease_until then
  redis.call('HSET', KEYS[1], 'expires_at', lease_until)
  redis.call('PEXPIREAT', KEYS[1], lease_until)
end
return 1
