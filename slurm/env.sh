# Network and launch settings for Tessera jobs: the ONE place they are set. Sourced by every
# slurm/*.sbatch template (and usable by hand: `source slurm/env.sh` before mpirun/srun).
#
# Every variable keeps a value you already exported (sbatch passes the submitting shell's environment
# by default), so site settings go in your shell, your sbatch --export, or a file named by
# TESSERA_ENV_FILE that is sourced last.

# --- NCCL (multi-node GPU jobs) ------------------------------------------------------------------
# Bootstrap/socket traffic: any interface but loopback and docker bridges (NCCL prefix syntax).
# Set e.g. NCCL_SOCKET_IFNAME=ib0 or =eth0 when the nodes have several networks.
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker}
# InfiniBand HCAs NCCL may use, e.g. "mlx5_0,mlx5_1" or "=mlx5_0:1"; unset lets NCCL pick all.
if [[ -n ${NCCL_IB_HCA:-} ]]; then export NCCL_IB_HCA; fi
# Set NCCL_IB_DISABLE=1 on clusters without InfiniBand/RoCE to force sockets.
if [[ -n ${NCCL_IB_DISABLE:-} ]]; then export NCCL_IB_DISABLE; fi
# GPUDirect RDMA distance (NCCL default is fine on most systems); kept if set.
if [[ -n ${NCCL_NET_GDR_LEVEL:-} ]]; then export NCCL_NET_GDR_LEVEL; fi
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# --- Open MPI (bootstrap and the CPU communicator) -----------------------------------------------
# Keep Open MPI's TCP traffic off loopback/docker unless told which interface to use.
if [[ -z ${OMPI_MCA_btl_tcp_if_include:-} && -z ${OMPI_MCA_btl_tcp_if_exclude:-} ]]; then
  export OMPI_MCA_btl_tcp_if_exclude=lo,docker0
fi
if [[ -z ${OMPI_MCA_oob_tcp_if_include:-} && -z ${OMPI_MCA_oob_tcp_if_exclude:-} ]]; then
  export OMPI_MCA_oob_tcp_if_exclude=lo,docker0
fi

# --- Tessera --------------------------------------------------------------------------------------
# Signal that asks training to checkpoint and requeue (train.preempt_signal). USR2, because NCCL/UCX
# and some MPI stacks install SIGUSR1 handlers of their own.
export TESSERA_PREEMPT_SIGNAL=${TESSERA_PREEMPT_SIGNAL:-USR2}

# --- Local test cluster (slurm/local-cluster sets TESSERA_SLURM_LOCAL=1) --------------------------
# Its two "nodes" share one kernel and one loopback interface: Open MPI's shared-memory transport
# must not be used between them, and every socket lives on lo.
if [[ ${TESSERA_SLURM_LOCAL:-0} == 1 ]]; then
  unset OMPI_MCA_btl_tcp_if_exclude OMPI_MCA_oob_tcp_if_exclude
  export OMPI_MCA_btl=self,tcp
  export OMPI_MCA_btl_tcp_if_include=lo
  export OMPI_MCA_oob_tcp_if_include=lo
  export NCCL_SOCKET_IFNAME=lo
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi

if [[ -n ${TESSERA_ENV_FILE:-} ]]; then
  # shellcheck source=/dev/null
  source "$TESSERA_ENV_FILE"
fi
