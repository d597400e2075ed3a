//! Opening a rank over libfabric (feature `ofi`): the ranks of a job meet in a
//! rendezvous directory every rank can reach, then exchange frames on a reliable
//! datagram endpoint of the chosen provider (`tcp;ofi_rxm` by default).

use std::time::Instant as WallInstant;

pub use backend_ofi::{OfiConfig, OfiError, OfiTransport, DEFAULT_PROVIDER};
use ft_runtime::{Driver, Runtime, RuntimeError};

use crate::Settings;

pub use backend_ofi::launcher_env::{
    config_from_env as launcher_config, rank_and_size, ADDRESS_VAR, PROVIDER_VAR, RANK_SIZE_VARS,
    RANK_VAR, RENDEZVOUS_VAR, SIZE_VAR,
};

/// Opens rank `config.rank` of a job of `config.size`: blocks until every rank reached
/// the rendezvous (or `config.connect_timeout` passes), then starts its progress thread.
pub fn open(config: OfiConfig, settings: &Settings) -> Result<Runtime, RuntimeError> {
    let settings = *settings;
    Runtime::spawn(move || {
        let (n, me) = (config.size, config.rank);
        let transport = OfiTransport::open(config).map_err(|e| e.to_string())?;
        Ok(Driver::for_groups(
            settings.stack(n, me),
            transport,
            WallInstant::now(),
        ))
    })
}

/// [`open`] with the configuration the launcher's variables give ([`config_from_env`]).
pub fn open_from_env(settings: &Settings) -> Result<Runtime, RuntimeError> {
    open(config_from_env()?, settings)
}

/// The configuration the launcher's variables give (`backend_ofi::launcher_env`): the
/// rank and size from `ftrun`'s, `mpiexec`'s, a PMI launcher's or Slurm's variables,
/// the rendezvous from [`RENDEZVOUS_VAR`].
pub fn config_from_env() -> Result<OfiConfig, RuntimeError> {
    launcher_config().map_err(RuntimeError::Stopped)
}
