-- KEYS[1] record; ARGV: token, status, headers, body, channel.
local rec = redis.call('HMGET', KEYS[1], 'token', 'state')
if rec[1] ~= ARGV[1] or rec[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[2], 'headers', ARGV[3], 'body', ARGV[4])
redis.call('PUBLISH', ARGV[5], 'done')
return 1
