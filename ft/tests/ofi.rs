//! `ft::ofi::open` over a real libfabric provider on loopback (feature `ofi`): three
//! ranks, each opened the way a library user opens one (a config and a rendezvous
//! directory), validate globally and broadcast 4 MiB through their handles.

use std::time::Duration;

use ft::ofi::{OfiConfig, DEFAULT_PROVIDER};
use ft::{OutputSet, OutputSpec, PlanSpec, Settings, Topology};

const N: u32 = 3;
const BYTES: usize = 4 << 20;

#[test]
fn three_ranks_validate_and_broadcast_through_ft_handles() {
    let dir = std::env::temp_dir().join(format!("ft-ofi-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a rendezvous directory");
    let provider =
        std::env::var("OFI_TEST_PROVIDER").unwrap_or_else(|_| DEFAULT_PROVIDER.to_owned());
    let settings = Settings {
        timeout: Duration::from_secs(5),
        ..Settings::default()
    };
    let payload: Vec<u8> = (0..BYTES).map(|i| (i % 241) as u8).collect();
    std::thread::scope(|s| {
        for me in 0..N {
            let (dir, provider, payload) = (&dir, &provider, &payload);
            s.spawn(move || {
                let mut config = OfiConfig::new(N, me, dir.clone());
                config.provider = provider.clone();
                config.address = Some("127.0.0.1".into());
                let handle = ft::ofi::open(config, &settings).expect("the rank opens");
                let g = handle.validate_global().expect("the ranks agree");
                assert!(g.agreed.is_empty() && g.epoch == 1);
                if me == 0 {
                    let spec = PlanSpec::new(N, 0)
                        .with_topology(Topology::Chain)
                        .with_output(OutputSpec::new("A", BYTES as u64, vec![1, 2]));
                    handle
                        .start_broadcast(1, spec, vec![payload.clone()])
                        .expect("started");
                } else {
                    let got = handle
                        .wait_outputs(
                            ft::TaskId::new(0, 1),
                            OutputSet::single(0),
                            Some(Duration::from_secs(120)),
                        )
                        .unwrap_or_else(|e| panic!("rank {me}: {e}"));
                    assert!(
                        got == [(0, payload.clone().into())],
                        "rank {me}: the output intact"
                    );
                }
                // A closing barrier: nobody leaves while a peer may still need its data.
                handle.validate_global().expect("the closing validation");
                handle.release(ft::TaskId::new(0, 1)).expect("released");
                handle
                    .shutdown(Duration::from_millis(200))
                    .expect("shut down");
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}
