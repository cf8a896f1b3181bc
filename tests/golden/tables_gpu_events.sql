SELECT time, host, gpu_uuid, kind, code, detail
FROM gpu_events
ORDER BY time, host, gpu_uuid, kind
