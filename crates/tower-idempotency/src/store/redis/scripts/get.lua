-- KEYS[1] record. Read-only, for operators: the live record's state, lease and expiry left (ms),
-- its saved answer, and how long ago it was first claimed (ms, -1 for a record written before
-- claims kept that time); an empty reply when there is none. Runs after prologue.lua.
local rec = redis.call('HMGET', KEYS[1], 'state', 'lease_until', 'expires_at', 'status',
  'headers', 'body', 'created_at')
local expires_at = tonumber(rec[3])
if not rec[1] or not expires_at or expires_at <= now then return {} end
local lease_until = tonumber(rec[2]) or now
local created_at = tonumber(rec[7])
local age = -1
if created_at then age = math.max(0, now - created_at) end
return {rec[1], math.max(0, lease_until - now), expires_at - now, rec[4] or '0', rec[5] or '',
  rec[6] or '', age}
