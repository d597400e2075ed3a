//! What a rank reads from the environment its launcher gave it: its rank and the job's
//! size, the rendezvous directory, and optionally the address to bind and the provider.
//!
//! The names are `ftrun`'s (`ft-launch`, which `ftofi` launches through too). Under a
//! cluster's launcher the rank and size come from that launcher's own variables
//! ([`RANK_SIZE_VARS`], tried in order) and the rendezvous from [`RENDEZVOUS_VAR`],
//! which the job's script exports, naming a directory every host shares.

use std::path::PathBuf;

use ft_core::Rank;

use crate::OfiConfig;

/// This rank's rank, as `ftrun` sets it.
pub const RANK_VAR: &str = "FTOFI_RANK";
/// The job's size, as `ftrun` sets it.
pub const SIZE_VAR: &str = "FTOFI_SIZE";
/// The job's rendezvous directory (fresh per job, reachable from every rank).
pub const RENDEZVOUS_VAR: &str = "FTOFI_RENDEZVOUS";
/// The local address the endpoint binds to (optional: the provider's first interface).
pub const ADDRESS_VAR: &str = "FTOFI_ADDRESS";
/// The libfabric provider (optional: [`crate::DEFAULT_PROVIDER`]).
pub const PROVIDER_VAR: &str = "FTOFI_PROVIDER";

/// Where launchers put a process's rank and the job's size, tried in this order:
/// `ftrun`'s own, Open MPI's `mpiexec`, MPICH's Hydra (and other PMI launchers), Slurm.
pub const RANK_SIZE_VARS: [(&str, &str); 4] = [
    (RANK_VAR, SIZE_VAR),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
];

/// This process's rank and the job's size, from the first pair of [`RANK_SIZE_VARS`]
/// whose rank variable is set; the error, in words, names the variable at fault.
pub fn rank_and_size() -> Result<(Rank, u32), String> {
    let (rank_var, size_var) = RANK_SIZE_VARS
        .iter()
        .find(|(rank, _)| std::env::var_os(rank).is_some())
        .ok_or_else(|| {
            let names: Vec<&str> = RANK_SIZE_VARS.iter().map(|(rank, _)| *rank).collect();
            format!("no launcher set this process's rank (none of {names:?})")
        })?;
    let read = |name: &str| -> Result<u32, String> {
        let text = std::env::var(name).map_err(|_| format!("{name} is not set"))?;
        text.parse()
            .map_err(|_| format!("{name}={text} is not a number"))
    };
    let (rank, size) = (read(rank_var)?, read(size_var)?);
    if rank >= size {
        return Err(format!("{rank_var}={rank} is outside 0..{size}"));
    }
    Ok((rank, size))
}

/// The configuration of this rank: [`rank_and_size`], [`RENDEZVOUS_VAR`] (required),
/// [`ADDRESS_VAR`] and [`PROVIDER_VAR`] (each if set), the rest [`OfiConfig::new`]'s.
pub fn config_from_env() -> Result<OfiConfig, String> {
    let (rank, size) = rank_and_size()?;
    let rendezvous = std::env::var_os(RENDEZVOUS_VAR)
        .ok_or_else(|| format!("{RENDEZVOUS_VAR} is not set (the job's rendezvous directory)"))?;
    let mut config = OfiConfig::new(size, rank, PathBuf::from(rendezvous));
    config.address = std::env::var(ADDRESS_VAR).ok();
    if let Ok(provider) = std::env::var(PROVIDER_VAR) {
        config.provider = provider;
    }
    Ok(config)
}
