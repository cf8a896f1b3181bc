SELECT time, host, gpu_uuid, pid, process_name, job_id, job_user, used_memory_bytes, sm_utilization
FROM gpu_processes
ORDER BY time, host, gpu_uuid, pid
