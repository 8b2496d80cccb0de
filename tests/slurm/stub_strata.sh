#!/usr/bin/env bash
# Stands in for strata in the no-progress tests of slurm_jobs.py: never writes a checkpoint.
#   STUB_EXIT=75     exit 75 at once (a "resumable stop" that made no progress)
#   STUB_EXIT=sleep  run until killed (the test requeues the job meanwhile)
#   STUB_EXIT=1      exit 1 at once (a failure the script restarts inside the allocation)
# The job script's questions are answered as strata would: no checkpoint ever.
case ${1:-} in
  config) echo "${STUB_CKPT_DIR:-runs/stub/checkpoints}"; exit 0 ;;
  checkpoint) echo -1; exit 0 ;;
esac
echo "stub attempt ${SLURM_RESTART_COUNT:-0} running on rank ${SLURM_PROCID:-0}: $*"
case ${STUB_EXIT:-75} in
  sleep) exec sleep 600 ;;
  *) exit "$STUB_EXIT" ;;
esac
