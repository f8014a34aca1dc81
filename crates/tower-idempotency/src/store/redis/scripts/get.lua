-- KEYS[1] record. Read-only, for operators: the live record's state, lease and expiry left (ms),
-- and its saved answer; an empty reply when there is none. Runs after prologue.lua.
local rec = redis.call('HMGET', KEYS[1], 'state', 'lease_until', 'expires_at', 'status',
  'headers', 'body')
local expires_at = tonumber(rec[3])
if not rec[1] or not expires_at or expires_at <= now then return {} end
local lease_until = tonumber(rec[2]) or now
return {rec[1], math.max(0, lease_until - now), expires_at - now, rec[4] or '0', rec[5] or '',
  rec[6] or ''}
