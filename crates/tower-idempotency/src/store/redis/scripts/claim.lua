-- KEYS[1] record; ARGV: fingerprint, token, lease ms, ttl ms. Runs after prologue.lua.
local rec = redis.call('HMGET', KEYS[1], 'fp', 'state', 'lease_until', 'expires_at',
  'status', 'headers', 'body', 'token')
local fp, state, lease_until, expires_at = rec[1], rec[2], tonumber(rec[3]), tonumber(rec[4])
if (fp or state or rec[3] or rec[4]) and not (expires_at and expires_at <= now) then
  if not fp or not expires_at then return {'corrupt'} end
  if fp ~= ARGV[1] then return {'mismatch'} end
  if state == 'done' then return {'done', rec[5], rec[6], rec[7]} end
  if state ~= 'running' or not lease_until then return {'corrupt'} end
  -- This claim itself, sent again (a cluster client resends a call whose answer was lost):
  -- the key is already its own.
  if rec[8] == ARGV[2] and lease_until > now then return {'claimed', 0} end
  if lease_until > now then return {'inflight', lease_until - now} end
  local lease = now + tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], 'token', ARGV[2], 'lease_until', lease)
  -- The new holder is live: the record does not expire before its lease, as after a renewal.
  if expires_at < lease then
    redis.call('HSET', KEYS[1], 'expires_at', lease)
    redis.call('PEXPIREAT', KEYS[1], lease)
  end
  return {'claimed', 1}
end
local exp = now + tonumber(ARGV[4])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'token', ARGV[2], 'state', 'running',
  'lease_until', now + tonumber(ARGV[3]), 'expires_at', exp, 'created_at', now)
redis.call('PEXPIREAT', KEYS[1], exp)
return {'claimed', 0}
