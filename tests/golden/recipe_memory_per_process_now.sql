SELECT host, gpu_uuid, pid, process_name, job_id, job_user,
       max(used_memory_bytes) AS used_memory_bytes, max(sm_utilization) AS sm_utilization
FROM gpu_processes
WHERE time > now() - INTERVAL '1 minute'
GROUP BY host, gpu_uuid, pid, process_name, job_id, job_user
ORDER BY used_memory_bytes DESC, host, pid
