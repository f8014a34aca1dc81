-- KEYS[1] record. Read-only: the lease time left of a running record, 0 for anything else.
-- Runs after prologue.lua.
local rec = redis.call('HMGET', KEYS[1], 'state', 'lease_until')
local lease_until = tonumber(rec[2])
if rec[1] ~= 'running' or not lease_until or lease_until <= now then return 0 end
return lease_until - now
