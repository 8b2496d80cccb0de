#!/usr/bin/env bash
# Stands in for strata in the no-progress tests of slurm_jobs.py: never writes a checkpoint.
#   STUB_EXIT=75     exit 75 at once (a "resumable stop" that made no progress)
#   STUB_EXIT=sleep  run until killed (the test requeues the job meanwhile)
#   STUB_EXIT=1      exit 1 at once (a failure the script restarts inside the allocation)
#   STUB_EXIT=late-report  rank 1 exits 1 at once; rank 0 then writes a watchdog report naming
#                    it in STUB_CKPT_DIR/hung-rank, as a short heartbeat timeout does, and exits 5
#   STUB_EXIT=abort-order  a hang as srun may report it: rank 1 writes the watchdog's report
#                    naming itself, then dies by SIGKILL (the watchdog's MPI_Abort killing the hung
#                    rank) before rank 0 would exit 5, so srun names the killed rank first
#   STUB_EXIT=node-fails   the tasks of the job's first node exit 1 at once, the others run
#                    until killed (with 2 tasks per node srun names them together: "tasks 0-1")
# The job script's questions are answered as strata would: no checkpoint ever.
case ${1:-} in
  config) echo "${STUB_CKPT_DIR:-runs/stub/checkpoints}"; exit 0 ;;
  checkpoint) echo -1; exit 0 ;;
esac
echo "stub attempt ${SLURM_RESTART_COUNT:-0} running on rank ${SLURM_PROCID:-0}: $*"
case ${STUB_EXIT:-75} in
  sleep) exec sleep 600 ;;
  late-report)
    [ "${SLURM_PROCID:-0}" != 0 ] && exit 1
    sleep 1
    printf 'job=%s rank=1 node=%s host=%s step=0 cause=heartbeats\n' "$SLURM_JOB_ID" \
      "$SLURMD_NODENAME" "$(hostname)" >"$STUB_CKPT_DIR/hung-rank"
    exit 5 ;;
  node-fails)
    [ "${SLURM_NODEID:-0}" = 0 ] && exit 1
    exec sleep 600 ;;
  abort-order)
    if [ "${SLURM_PROCID:-0}" = 1 ]; then
      printf 'job=%s rank=1 node=%s host=%s step=0 cause=heartbeats\n' "$SLURM_JOB_ID" \
        "$SLURMD_NODENAME" "$(hostname)" >"$STUB_CKPT_DIR/hung-rank"
      kill -KILL $$
    fi
    sleep 30
    exit 5 ;;
  *) exit "$STUB_EXIT" ;;
esac
