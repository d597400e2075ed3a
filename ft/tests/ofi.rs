//! `ft::ofi::open` over a real libfabric provider on loopback (feature `ofi`): three
//! ranks, each opened the way a library user opens one (a config and a rendezvous
//! directory), validate globally and broadcast 4 MiB through their handles; four ranks
//! shrink, and the shrunk group validates, broadcasts and carries messages over the
//! connections the ranks had, opening none.

use std::sync::Barrier;
use std::time::Duration;

use ft::ofi::{OfiConfig, DEFAULT_PROVIDER};
use ft::{Event, OutputSet, OutputSpec, PlanSpec, Runtime, Settings, Topology};

const N: u32 = 3;

/// The tests count the process's sockets: one runs at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
const BYTES: usize = 4 << 20;

#[test]
fn three_ranks_validate_and_broadcast_through_ft_handles() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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

/// The process's open sockets (the provider's connections among them).
fn sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// Sends one message to every other rank of `handle`'s group and takes one from each.
fn all_to_all(handle: &Runtime, tag: u64) {
    let view = handle.view();
    let (me, n) = (view.rank(), view.size());
    for to in (0..n).filter(|&r| r != me) {
        handle.send(to, tag, vec![me as u8; 100]).expect("sent");
    }
    let mut heard = 0;
    while heard < n - 1 {
        match handle.next_event(Some(Duration::from_secs(60))) {
            Ok(Some(Event::Message {
                tag: t,
                from,
                bytes,
            })) => {
                assert_eq!((t, bytes[0]), (tag, from as u8));
                heard += 1;
            }
            Ok(Some(_)) => {}
            other => panic!("rank {me}: no message ({other:?})"),
        }
    }
}

#[test]
fn a_shrunk_group_runs_on_the_connections_the_ranks_had() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const RANKS: u32 = 4;
    let dir = std::env::temp_dir().join(format!("ft-ofi-shrink-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a rendezvous directory");
    let provider =
        std::env::var("OFI_TEST_PROVIDER").unwrap_or_else(|_| DEFAULT_PROVIDER.to_owned());
    let settings = Settings {
        timeout: Duration::from_secs(5),
        ..Settings::default()
    };
    let phase = Barrier::new(RANKS as usize);
    let counts = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for me in 0..RANKS {
            let (dir, provider, phase, counts) = (&dir, &provider, &phase, &counts);
            s.spawn(move || {
                let mut config = OfiConfig::new(RANKS, me, dir.clone());
                config.provider = provider.clone();
                config.address = Some("127.0.0.1".into());
                let handle = ft::ofi::open(config, &settings).expect("the rank opens");
                // Every pair talks once, so every connection the group needs is open.
                all_to_all(&handle, 1);
                handle.validate_global().expect("the ranks agree");
                if phase.wait().is_leader() {
                    counts.lock().unwrap().push(sockets());
                }
                phase.wait();
                let shrunk = handle.shrink().expect("shrinks");
                assert_eq!(
                    shrunk.view().rank(),
                    me,
                    "nobody failed: the same numbering"
                );
                let g = shrunk.validate_global().expect("the shrunk group agrees");
                assert!(g.agreed.is_empty() && g.epoch == 1);
                all_to_all(&shrunk, 2);
                let bytes: Vec<u8> = (0..200_000).map(|i| (i % 253) as u8).collect();
                if me == 1 {
                    let spec = PlanSpec::new(RANKS, 1)
                        .with_topology(Topology::Binomial)
                        .with_output(OutputSpec::new("A", bytes.len() as u64, vec![0, 2, 3]));
                    shrunk
                        .start_broadcast(4, spec, vec![bytes])
                        .expect("started");
                } else {
                    let got = shrunk
                        .wait_outputs(ft::TaskId::new(1, 4), OutputSet::single(0), None)
                        .expect("the output arrives");
                    assert!(got[0].1 == bytes);
                }
                shrunk.validate_global().expect("the closing validation");
                if phase.wait().is_leader() {
                    counts.lock().unwrap().push(sockets());
                }
                phase.wait();
                shrunk
                    .shutdown(Duration::from_millis(200))
                    .expect("shut down");
                handle
                    .shutdown(Duration::from_millis(200))
                    .expect("shut down");
            });
        }
    });
    let counts = counts.into_inner().unwrap();
    eprintln!("sockets before the shrink and after the shrunk group's work: {counts:?}");
    assert!(counts[0] > 0, "the provider's connections are sockets");
    assert_eq!(
        counts[0], counts[1],
        "no connection opened for the shrunk group"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
