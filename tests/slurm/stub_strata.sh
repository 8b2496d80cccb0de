#!/usr/bin/env bash
# Stands in for strata in the no-progress tests of slurm_jobs.py: never writes a checkpoint.
#   STUB_EXIT=75     exit 75 at once (a "resumable stop" that made no progress)
#   STUB_EXIT=sleep  run until killed (the test requeues the job meanwhile)
#   STUB_EXIT=1      exit 1 at once (a failure the script restarts inside the allocation)
echo "stub attempt ${SLURM_RESTART_COUNT:-0} running on rank ${SLURM_PROCID:-0}: $*"
case ${STUB_EXIT:-75} in
  sleep) exec sleep 600 ;;
  *) exit "$STUB_EXIT" ;;
esac
