"""A Slurm job seen from this machine, where the local cluster's nodes all run
(slurm/local-cluster.sh): scontrol's view of the job, and its processes, found by SLURM_JOB_ID
in their environment (each cluster numbers its jobs from its own FirstJobId). Shared by the
Slurm tests (slurm_jobs.py) and benchmarks/bench_goodput.py."""
import os
import re


def parse_job(scontrol_stdout):
    """`scontrol -o show job J`'s KEY=VALUE pairs (the first of each key)."""
    info = {}
    for m in re.finditer(r"(\w+)=(\S*)", scontrol_stdout):
        info.setdefault(m.group(1), m.group(2))
    return info


def _environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


def job_processes(job):
    """Processes of the job still alive (its batch script, srun, ranks). A job started again
    while its old instance lives on a node makes slurmctld drain that node ("Duplicate jobid")."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            if f"\0SLURM_JOB_ID={job}\0".encode() in b"\0" + _environ(d):
                found.append(int(d))
        except OSError:
            continue
    return found


def find_rank_process(job, rank):
    """(pid, Slurm node) of the strata process of rank RANK of job JOB, or None."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/comm") as f:
                if f.read().strip() != "strata":
                    continue
            env = dict(kv.split("=", 1) for kv in _environ(d).decode(errors="replace").split("\0") if "=" in kv)
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == job and env.get("SLURM_PROCID") == str(rank):
            return int(d), env.get("SLURMD_NODENAME", "?")
    return None
