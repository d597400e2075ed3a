//! Opening a rank over libfabric (feature `ofi`): the ranks of a job meet in a
//! rendezvous directory every rank can reach, then exchange frames on a reliable
//! datagram endpoint of the chosen provider (`tcp;ofi_rxm` by default).

use std::path::PathBuf;
use std::time::Instant as WallInstant;

pub use backend_ofi::{OfiConfig, OfiError, OfiTransport, DEFAULT_PROVIDER};
use ft_runtime::{Driver, Runtime, RuntimeError};

use crate::Settings;

/// The variables the `ftofi` launcher sets for each rank it starts.
pub const RANK_VAR: &str = "FTOFI_RANK";
/// See [`RANK_VAR`].
pub const SIZE_VAR: &str = "FTOFI_SIZE";
/// See [`RANK_VAR`].
pub const RENDEZVOUS_VAR: &str = "FTOFI_RENDEZVOUS";
/// See [`RANK_VAR`] (optional: the local address to bind).
pub const ADDRESS_VAR: &str = "FTOFI_ADDRESS";
/// See [`RANK_VAR`] (optional: the provider).
pub const PROVIDER_VAR: &str = "FTOFI_PROVIDER";

/// Opens rank `config.rank` of a job of `config.size`: blocks until every rank reached
/// the rendezvous (or `config.connect_timeout` passes), then starts its progress thread.
pub fn open(config: OfiConfig, settings: &Settings) -> Result<Runtime, RuntimeError> {
    let settings = *settings;
    Runtime::spawn(move || {
        let (n, me) = (config.size, config.rank);
        let transport = OfiTransport::open(config).map_err(|e| e.to_string())?;
        Ok(Driver::for_stack(
            settings.stack(n, me),
            transport,
            WallInstant::now(),
        ))
    })
}

/// [`open`] with the configuration the launcher's variables give ([`RANK_VAR`], ...).
pub fn open_from_env(settings: &Settings) -> Result<Runtime, RuntimeError> {
    open(config_from_env()?, settings)
}

/// The configuration the launcher's variables give.
pub fn config_from_env() -> Result<OfiConfig, RuntimeError> {
    let var = |name: &str| {
        std::env::var(name).map_err(|_| RuntimeError::Stopped(format!("{name} is not set")))
    };
    let number = |name: &str| -> Result<u32, RuntimeError> {
        var(name)?
            .parse()
            .map_err(|_| RuntimeError::Stopped(format!("{name} is not a number")))
    };
    let (rank, size) = (number(RANK_VAR)?, number(SIZE_VAR)?);
    let mut config = OfiConfig::new(size, rank, PathBuf::from(var(RENDEZVOUS_VAR)?));
    config.address = std::env::var(ADDRESS_VAR).ok();
    if let Ok(provider) = std::env::var(PROVIDER_VAR) {
        config.provider = provider;
    }
    Ok(config)
}
