-- Prologue of the scripts that read the clock: effect replication on servers older than 7
-- (a no-op on 7), and `now` in Unix milliseconds from the server's clock.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
