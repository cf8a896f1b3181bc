SELECT host, count(*) AS xid_events, count(DISTINCT gpu_uuid) AS gpus,
       array_to_string(array_agg(DISTINCT code ORDER BY code), ',') AS codes,
       max(time) AS last_seen
FROM gpu_events
WHERE kind = 'xid' AND time > now() - INTERVAL '24 hours'
GROUP BY host
ORDER BY xid_events DESC, host
