// What strata learns from the job around it: stop requests (signals), the Slurm job's end time,
// its id and restart count.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace strata {

// SIGUSR1 (Slurm's --signal warning, forwarded by slurm/train.sbatch) and SIGTERM (scancel,
// pre-emption, the time limit) only set a flag; the training loop agrees on a stop step over
// all ranks, writes a checkpoint and exits with kExitResumable. Call on the training thread
// before it starts other threads: they and it block the signals; a thread of their own takes them.
void install_stop_handlers();
int stop_signal();  // the first stop signal received, 0 if none
const char* signal_name(int sig);

// Unix time at which the scheduler will end this job: $STRATA_JOB_END_TIME if set (a value
// that is not a time, or is already past, is a UserError), else the Slurm job's EndTime from
// `squeue -j ID` (run without a shell, 10 s at most) when $SLURM_JOB_ID is set; nullopt if
// unknown or unlimited. `why_not` receives a one-line reason when it is unknown in a Slurm job.
std::optional<double> job_end_time(std::string* why_not);

// The variables above and below, validated (UserError naming the variable): call where all
// ranks agree on input errors, before training.
void check_job_environment();
// This rank's index among the ranks of its node, and the variable it came from: the launcher's
// own (mpirun's OMPI_COMM_WORLD_LOCAL_RANK, Hydra's MPI_LOCALRANKID) before srun's
// SLURM_LOCALID, which mpirun's ranks inside an allocation all inherit as 0.
struct NodeLocalRank {
  int rank = 0;
  const char* source = "";
};
NodeLocalRank node_local_rank();
// Whether an MPI launcher started this process: mpirun (OMPI_*), srun --mpi=pmix (PMIX_*) or a
// PMI-1/2 launcher (PMI_*) leave their variables; an MPI singleton has none of them.
bool started_by_mpi_launcher();
std::string slurm_job_id();  // "" outside Slurm; digits ("123", or "123_4" for an array task)
int64_t slurm_restart_count();
// The Slurm node this rank runs on ($SLURMD_NODENAME: letters, digits, '.', '_', '-'), else the
// host name. On the local test cluster two "nodes" share one host: only this tells them apart.
std::string slurm_node_name();
// When this process's srun step was launched: $STRATA_STEP_START (unix seconds, set by
// slurm/train.sbatch before each srun), else when this process started. Never in the future.
double launch_time();
// When this job attempt's batch script started ($STRATA_ATTEMPT_START), else launch_time().
double attempt_start_time();
std::string utc_now_iso();   // 2026-11-22T04:58:00Z
std::string local_clock_time(double unix_s);  // 14:05:00
double unix_now();

}  // namespace strata
