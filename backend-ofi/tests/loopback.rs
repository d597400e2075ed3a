//! The libfabric transport on a real provider over loopback: one transport per thread,
//! meeting through a fresh rendezvous directory, no mocks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use backend_ofi::{OfiConfig, OfiError, OfiTransport, DEFAULT_PROVIDER};
use ft_core::{wire, Rank};
use ft_runtime::{Bytes, Received, Transport};

/// The provider under test: `OFI_TEST_PROVIDER` (e.g. `sockets`, `shm`, `udp;ofi_rxd`)
/// or [`DEFAULT_PROVIDER`].
fn provider() -> String {
    std::env::var("OFI_TEST_PROVIDER").unwrap_or_else(|_| DEFAULT_PROVIDER.to_owned())
}

/// The longest any test drives its transports before giving up.
const LIMIT: Duration = Duration::from_secs(60);

/// A fresh rendezvous directory, removed when the test ends.
struct Rendezvous(PathBuf);

impl Rendezvous {
    fn new(test: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!(
            "backend-ofi-{test}-{}-{}-{stamp}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("make the rendezvous directory");
        Rendezvous(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `body` at every rank of an `n`-rank group on `provider`, one thread per rank,
/// and returns what each returned, in rank order.
fn group<R: Send>(
    test: &str,
    n: u32,
    provider: &str,
    configure: impl Fn(&mut OfiConfig) + Sync,
    body: impl Fn(OfiTransport) -> R + Sync,
) -> Vec<R> {
    let rendezvous = Rendezvous::new(test);
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (configure, body, dir) = (&configure, &body, rendezvous.path());
                s.spawn(move || {
                    let mut config = OfiConfig::new(n, rank, dir);
                    config.provider = provider.to_owned();
                    configure(&mut config);
                    let transport = OfiTransport::open(config)
                        .unwrap_or_else(|e| panic!("rank {rank}: open failed: {e}"));
                    body(transport)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    })
}

/// Frame `seq` from `from` to `to`: a header naming all three, then bytes that depend
/// on them, `len` bytes in all (at least 12).
fn frame(from: Rank, to: Rank, seq: u32, len: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&from.to_le_bytes());
    bytes.extend_from_slice(&to.to_le_bytes());
    bytes.extend_from_slice(&seq.to_le_bytes());
    let salt = from.wrapping_mul(31) ^ to.wrapping_mul(17) ^ seq;
    bytes.extend((12..len).map(|i| (i as u32 ^ salt).wrapping_mul(2_654_435_761) as u8));
    bytes
}

/// The sequence number of a frame `frame` made, after checking every byte of it.
fn check_frame(from: Rank, to: Rank, bytes: &[u8], len_of: impl Fn(u32) -> usize) -> u32 {
    assert!(bytes.len() >= 12, "a frame of {} bytes", bytes.len());
    let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
    assert_eq!(word(0), from, "frame claims another sender");
    assert_eq!(word(4), to, "frame meant for another rank");
    let seq = word(8);
    assert_eq!(
        bytes,
        &frame(from, to, seq, len_of(seq))[..],
        "frame {seq} from {from} to {to} corrupted"
    );
    seq
}

/// Drives `t`: receives everything that arrived (frames copied into `inbox`; an
/// oversized message fails the test), progresses, then asks `step`, which may send and
/// says whether the rank is done. Panics after [`LIMIT`].
fn drive(
    t: &mut OfiTransport,
    what: &str,
    mut step: impl FnMut(&mut OfiTransport, &mut Vec<(Rank, Vec<u8>)>) -> bool,
) {
    let start = Instant::now();
    let mut inbox = Vec::new();
    loop {
        while let Some(received) = t.try_recv().expect("try_recv") {
            match received {
                Received::Frame { from, bytes } => inbox.push((from, bytes.to_vec())),
                Received::Owned { from, frame } => inbox.push((from, frame.to_vec())),
                Received::Oversized { from, len } => {
                    panic!("rank {}: oversized {len} from {from}", t.rank())
                }
            }
        }
        t.progress().expect("progress");
        if step(t, &mut inbox) {
            return;
        }
        assert!(
            start.elapsed() < LIMIT,
            "rank {}: {what} not done after {LIMIT:?}: {t:?}",
            t.rank()
        );
        thread::yield_now();
    }
}

/// How [`all_to_all`] sends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sending {
    /// Every frame with `send`.
    Whole,
    /// Odd frames with `send_parts`: a head of 12 to 51 bytes and the rest as a shared
    /// payload (the transport must gather them, not copy).
    Parts,
}

/// Every rank sends `per_pair` frames (of `len_of(seq)` bytes) to every rank, itself
/// included; every rank checks it got each exactly once, intact. Returns, per rank,
/// whether each sender's frames arrived in the order sent.
fn all_to_all(
    test: &str,
    n: u32,
    provider: &str,
    per_pair: u32,
    len_of: impl Fn(u32) -> usize + Sync,
) -> Vec<bool> {
    all_to_all_sending(test, n, provider, per_pair, len_of, Sending::Whole)
}

/// [`all_to_all`], sending as `sending` says.
fn all_to_all_sending(
    test: &str,
    n: u32,
    provider: &str,
    per_pair: u32,
    len_of: impl Fn(u32) -> usize + Sync,
    sending: Sending,
) -> Vec<bool> {
    let finished = AtomicUsize::new(0);
    let t0 = Instant::now();
    let in_order = group(
        test,
        n,
        provider,
        |_| {},
        |mut t| {
            let me = t.rank();
            let mut seen: BTreeMap<Rank, Vec<u32>> = BTreeMap::new();
            let mut next = vec![0u32; n as usize];
            let mut counted_done = false;
            drive(&mut t, "all-to-all", |t, inbox| {
                for (from, bytes) in inbox.drain(..) {
                    let seq = check_frame(from, me, &bytes, &len_of);
                    seen.entry(from).or_default().push(seq);
                }
                // Send a little at a time, interleaved with receiving, as a protocol does.
                for to in 0..n {
                    for _ in 0..8 {
                        let seq = next[to as usize];
                        if seq < per_pair {
                            let bytes = frame(me, to, seq, len_of(seq));
                            if sending == Sending::Parts && seq % 2 == 1 {
                                assert!(!t.copies_payload(), "the provider gathers two buffers");
                                let head = (12 + seq as usize % 40).min(bytes.len());
                                let payload = Bytes::copy_from_slice(&bytes[head..]);
                                t.send_parts(to, &bytes[..head], &payload).expect("send");
                            } else {
                                t.send(to, &bytes).expect("send");
                            }
                            next[to as usize] += 1;
                        }
                    }
                }
                let received: usize = seen.values().map(Vec::len).sum();
                let mine_done = received == (n * per_pair) as usize
                    && next.iter().all(|&s| s == per_pair)
                    && t.pending_sends() == 0;
                if mine_done && !counted_done {
                    counted_done = true;
                    finished.fetch_add(1, Ordering::SeqCst);
                }
                // Keep progressing until every rank is done: the others may still
                // need this rank's side of a connection.
                finished.load(Ordering::SeqCst) == n as usize
            });
            let stats = t.stats();
            assert_eq!(stats.sent, u64::from(n * per_pair));
            // When every frame is a whole one no longer than the inject size (the
            // small-frames test), they go by fi_injectdata, but for those the provider
            // had no room for (a connection still being made) and those queued behind.
            let all_short = sending == Sending::Whole
                && (0..per_pair).all(|seq| len_of(seq) <= t.inject_size());
            assert!(stats.injected <= stats.sent);
            if all_short {
                assert!(stats.injected > 0, "rank {me}: short frames, none injected");
            }
            assert_eq!(stats.received, u64::from(n * per_pair));
            assert_eq!(
                stats.send_errors + stats.send_stalled + stats.send_abandoned + stats.bad_sender,
                0
            );
            let mut ordered = true;
            for from in 0..n {
                let mut seqs = seen.remove(&from).unwrap_or_default();
                ordered &= seqs.windows(2).all(|w| w[0] < w[1]);
                seqs.sort_unstable();
                assert!(
                    seqs.iter().copied().eq(0..per_pair),
                    "rank {me}: frames from {from} missing or repeated"
                );
            }
            eprintln!(
                "{test}: rank {me} on {}: {stats:?}, in order: {ordered}",
                t.provider()
            );
            ordered
        },
    );
    eprintln!("{test}: {:?}", t0.elapsed());
    in_order
}

#[test]
fn all_to_all_small_frames_arrive_intact() {
    let in_order = all_to_all("small", 4, &provider(), 50, |seq| 12 + seq as usize);
    eprintln!("small: in order per receiver: {in_order:?}");
}

#[test]
fn all_to_all_many_frames_up_to_max_frame() {
    let max = wire::frame_capacity(4);
    let in_order = all_to_all("many", 4, &provider(), 2000, |seq| {
        12 + (seq as usize * 7919) % (max - 11)
    });
    // The transport does not ask for FI_ORDER_SAS, and with ofi_rxm's dynamic receive
    // buffers on, a rendezvous-size frame can complete after eager frames sent behind
    // it. So only the set of frames is asserted, never their order.
    eprintln!("many: in order per receiver: {in_order:?}");
}

#[test]
fn frames_sent_in_two_parts_arrive_whole() {
    let max = wire::frame_capacity(4);
    all_to_all_sending(
        "parts",
        4,
        &provider(),
        300,
        |seq| 12 + (seq as usize * 7919) % (max - 11),
        Sending::Parts,
    );
    all_to_all_sending(
        "parts-sockets",
        3,
        "sockets",
        100,
        |seq| 12 + (seq as usize * 7919) % (max - 11),
        Sending::Parts,
    );
}

#[test]
fn all_to_all_on_the_sockets_provider() {
    all_to_all("sockets", 4, "sockets", 200, |seq| {
        12 + (seq as usize * 7919) % (wire::frame_capacity(4) - 11)
    });
}

#[test]
fn oversized_frames_are_reported_and_the_transport_keeps_working() {
    const SMALL_MAX: usize = 1024;
    // Eager (under the provider's buffer size) and rendezvous (above it) messages take
    // different paths through tcp;ofi_rxm: try both.
    let oversized = [SMALL_MAX + 1, 5000, 200_000];
    let normal = 20u32;
    let finished = AtomicUsize::new(0);
    group(
        "oversized",
        2,
        &provider(),
        |config| {
            if config.rank == 1 {
                config.max_frame = SMALL_MAX;
            }
        },
        |mut t| {
            let me = t.rank();
            let mut reported = Vec::new();
            let mut frames = Vec::new();
            if me == 0 {
                for &len in &oversized {
                    t.send(1, &frame(0, 1, 1000 + len as u32, len))
                        .expect("send");
                }
                for seq in 0..normal {
                    t.send(1, &frame(0, 1, seq, 12 + seq as usize))
                        .expect("send");
                }
            }
            let start = Instant::now();
            let mut counted = false;
            while finished.load(Ordering::SeqCst) < 2 {
                while let Some(received) = t.try_recv().expect("try_recv") {
                    match received {
                        Received::Oversized { from, len } => reported.push((from, len)),
                        Received::Frame { from, bytes } => {
                            frames.push(check_frame(from, me, bytes, |seq| 12 + seq as usize))
                        }
                        Received::Owned { from, frame } => {
                            frames.push(check_frame(from, me, &frame, |seq| 12 + seq as usize))
                        }
                    }
                }
                t.progress().expect("progress");
                let done = if me == 0 {
                    t.pending_sends() == 0
                } else {
                    reported.len() == oversized.len() && frames.len() == normal as usize
                };
                if done && !counted {
                    counted = true;
                    finished.fetch_add(1, Ordering::SeqCst);
                }
                assert!(start.elapsed() < LIMIT, "rank {me} stuck: {t:?}");
                thread::yield_now();
            }
            if me == 1 {
                reported.sort_unstable();
                let expected: Vec<_> = oversized.iter().map(|&len| (0, len)).collect();
                assert_eq!(reported, expected, "oversized messages as reported");
                frames.sort_unstable();
                assert!(frames.iter().copied().eq(0..normal));
                assert_eq!(t.stats().oversized, oversized.len() as u64);
                assert_eq!(t.stats().received, u64::from(normal));
            }
            eprintln!("oversized: rank {me}: {:?}", t.stats());
        },
    );
}

/// Rank 2 of 3 leaves (drops its transport) while ranks 0 and 1 send to everyone, rank
/// 2 included, frames of up to 40 KB (eager and rendezvous sizes for tcp;ofi_rxm);
/// they go on for a while after it left, then stop, and must: see no error and no
/// panic; drain every send within a few seconds; receive every frame the other
/// survivor sent them.
///
/// With `victim_connects`, rank 2 receives for a while first (connections up, frames in
/// flight when it leaves); without, it leaves right after publishing its name.
///
/// The survivors' sending window runs from when rank 2 starts leaving, not from when
/// its drop returned: `tcp;ofi_rxm` (libfabric 1.17) spins in the endpoint's
/// `fi_close` for as long as connected peers keep sending to it, so a window that
/// waited for the drop to return would never end.
fn survivors_keep_sending_to_a_peer_that_left(test: &str, victim_connects: bool) {
    const N: u32 = 3;
    const VICTIM: Rank = 2;
    const KEEP_SENDING: Duration = Duration::from_millis(1500);
    const STALL: Duration = Duration::from_secs(2);
    const DRAIN_LIMIT: Duration = Duration::from_secs(5);
    let victim_leaving = AtomicUsize::new(0);
    let victim_gone = AtomicUsize::new(0);
    let rounds_sent = [AtomicUsize::new(usize::MAX), AtomicUsize::new(usize::MAX)];
    let survivors_done = AtomicUsize::new(0);
    group(
        test,
        N,
        &provider(),
        |config| config.stall_timeout = STALL,
        |mut t| {
            let me = t.rank();
            let len_of = |seq: u32| 12 + (seq as usize * 977) % 40_000;
            if me == VICTIM {
                let mut got = 0;
                let start = Instant::now();
                while victim_connects && got < 300 {
                    while let Some(received) = t.try_recv().expect("try_recv") {
                        assert!(matches!(
                            received,
                            Received::Frame { .. } | Received::Owned { .. }
                        ));
                        got += 1;
                    }
                    t.progress().expect("progress");
                    assert!(start.elapsed() < LIMIT, "victim stuck: {t:?}");
                }
                eprintln!("{test}: victim leaves: {:?}", t.stats());
                victim_leaving.store(1, Ordering::SeqCst);
                drop(t);
                victim_gone.store(1, Ordering::SeqCst);
                return;
            }
            let other = 1 - me;
            let from_other = std::cell::Cell::new(0usize);
            let pump = |t: &mut OfiTransport| {
                while let Some(received) = t.try_recv().expect("try_recv") {
                    let frame = match received {
                        Received::Frame { from, bytes } => Some((from, bytes.to_vec())),
                        Received::Owned { from, frame } => Some((from, frame.to_vec())),
                        _ => None,
                    };
                    if let Some((from, bytes)) = frame {
                        check_frame(from, me, &bytes, len_of);
                        if from == other {
                            from_other.set(from_other.get() + 1);
                        }
                    }
                }
                t.progress().expect("progress");
            };
            if !victim_connects {
                while victim_gone.load(Ordering::SeqCst) == 0 {
                    thread::yield_now();
                }
            }
            let mut seq = 0;
            let mut gone_at = None;
            loop {
                for to in 0..N {
                    t.send(to, &frame(me, to, seq, len_of(seq)))
                        .expect("send to a peer that left must not fail");
                }
                seq += 1;
                pump(&mut t);
                thread::sleep(Duration::from_micros(500));
                if victim_leaving.load(Ordering::SeqCst) == 1 {
                    let gone_at = *gone_at.get_or_insert_with(Instant::now);
                    if gone_at.elapsed() >= KEEP_SENDING {
                        break;
                    }
                }
                assert!(seq < 1_000_000);
            }
            rounds_sent[me as usize].store(seq as usize, Ordering::SeqCst);
            let stopped = Instant::now();
            loop {
                pump(&mut t);
                let expected = rounds_sent[other as usize].load(Ordering::SeqCst);
                if t.pending_sends() == 0 && from_other.get() == expected {
                    break;
                }
                assert!(
                    stopped.elapsed() < DRAIN_LIMIT,
                    "rank {me}: {} sends pending, {} of {expected} frames from rank \
                     {other}, {DRAIN_LIMIT:?} after the last send: {t:?}",
                    t.pending_sends(),
                    from_other.get()
                );
                thread::sleep(Duration::from_millis(1));
            }
            let stats = t.stats();
            eprintln!(
                "{test}: rank {me} drained in {:?} after {seq} rounds: {stats:?}",
                stopped.elapsed(),
            );
            assert_eq!(stats.oversized + stats.bad_sender + stats.recv_errors, 0);
            // The other survivor may still need this rank's side of their connection.
            survivors_done.fetch_add(1, Ordering::SeqCst);
            while survivors_done.load(Ordering::SeqCst) < 2 {
                pump(&mut t);
                thread::yield_now();
            }
        },
    );
}

#[test]
fn a_peer_that_leaves_after_connecting_is_a_dropped_frame() {
    survivors_keep_sending_to_a_peer_that_left("left-connected", true);
}

#[test]
fn a_peer_that_leaves_before_anyone_connected_is_a_dropped_frame() {
    survivors_keep_sending_to_a_peer_that_left("left-unconnected", false);
}

#[test]
fn sending_outside_the_job_is_a_typed_error() {
    group(
        "misuse",
        1,
        &provider(),
        |_| {},
        |mut t| {
            match t.send(1, b"to nobody") {
                Err(OfiError::RankOutOfRange { rank: 1, size: 1 }) => {}
                other => panic!("send to rank 1 of 1: {other:?}"),
            }
            assert!(matches!(
                t.send(Rank::MAX, b"to nobody"),
                Err(OfiError::RankOutOfRange { .. })
            ));
            // The transport still works: a frame to itself arrives.
            t.send(0, b"to myself").expect("send to self");
            let start = Instant::now();
            loop {
                if let Some(received) = t.try_recv().expect("try_recv") {
                    assert_eq!(
                        received,
                        Received::Frame {
                            from: 0,
                            bytes: b"to myself"
                        }
                    );
                    break;
                }
                t.progress().expect("progress");
                assert!(start.elapsed() < LIMIT);
            }
        },
    );
}

#[test]
fn an_invalid_configuration_is_a_typed_error() {
    let rendezvous = Rendezvous::new("config");
    let open = |config: OfiConfig| OfiTransport::open(config).map(|_| ());
    assert!(matches!(
        open(OfiConfig::new(2, 2, rendezvous.path())),
        Err(OfiError::InvalidConfig { .. })
    ));
    let mut config = OfiConfig::new(1, 0, rendezvous.path());
    config.provider = provider();
    config.max_frame = 0;
    assert!(matches!(open(config), Err(OfiError::InvalidConfig { .. })));
    let mut config = OfiConfig::new(1, 0, rendezvous.path());
    config.provider = "no-such-provider".into();
    let err = open(config).expect_err("an unknown provider");
    assert!(
        matches!(&err, OfiError::ProviderNotFound { provider } if provider == "no-such-provider"),
        "{err:?}"
    );
    assert!(err.to_string().contains("no-such-provider"), "{err}");
}

#[test]
fn a_rank_that_never_shows_up_times_the_rendezvous_out() {
    let rendezvous = Rendezvous::new("timeout");
    let mut config = OfiConfig::new(3, 0, rendezvous.path());
    config.provider = provider();
    config.connect_timeout = Duration::from_millis(300);
    let start = Instant::now();
    let err = OfiTransport::open(config).expect_err("ranks 1 and 2 never come");
    match &err {
        OfiError::RendezvousTimeout { missing, waited } => {
            assert_eq!(missing, &[1, 2]);
            assert!(*waited >= Duration::from_millis(300));
        }
        other => panic!("expected a rendezvous timeout, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    eprintln!("timeout: {err}");
    // Its own name was published.
    assert!(rendezvous.path().join("rank-0.addr").exists());
}

#[test]
fn an_idle_wait_ends_when_a_frame_arrives() {
    // Rank 1 blocks in `wait` with a long timeout; rank 0 sends once the connection is
    // up. The wait must end on the arrival, not on its timeout (providers with a CQ wait
    // object; the others nap, which `wakes_on_arrival` says).
    const TIMEOUT: Duration = Duration::from_secs(20);
    let provider = provider();
    let waited = group(
        "wait",
        2,
        &provider,
        |_| {},
        |mut t| {
            use ft_runtime::Transport;
            // Connect both ways first: tcp;ofi_rxm sets connections up on first send.
            let peer = 1 - t.rank();
            t.send(peer, b"hello").expect("send");
            let start = Instant::now();
            let mut got = 0;
            while got < 1 && start.elapsed() < LIMIT {
                t.progress().expect("progress");
                if let Some(Received::Frame { .. }) = t.try_recv().expect("recv") {
                    got += 1;
                }
            }
            assert_eq!(
                got,
                1,
                "rank {}: the peer's first frame never came",
                t.rank()
            );
            thread::sleep(Duration::from_millis(300));
            if t.rank() == 0 {
                t.send(peer, b"wake up").expect("send");
                let end = Instant::now() + Duration::from_secs(2);
                while Instant::now() < end {
                    t.progress().expect("progress");
                    let _ = t.try_recv().expect("recv");
                }
                return None;
            }
            let wakes = t.wakes_on_arrival();
            let start = Instant::now();
            let mut woken = None;
            while woken.is_none() && start.elapsed() < LIMIT {
                t.wait(TIMEOUT).expect("wait");
                if let Some(Received::Frame { bytes, .. }) = t.try_recv().expect("recv") {
                    woken = Some((bytes.to_vec(), start.elapsed()));
                }
            }
            Some((wakes, woken))
        },
    );
    let (wakes, woken) = waited[1].clone().expect("rank 1's result");
    if provider == DEFAULT_PROVIDER {
        assert!(wakes, "tcp;ofi_rxm's CQ has a wait object");
    }
    let (bytes, after) = woken.expect("the frame arrived");
    assert_eq!(bytes, b"wake up");
    if wakes {
        assert!(after < TIMEOUT / 2, "woke after {after:?}, not on arrival");
    }
}

#[test]
fn a_waker_ends_an_idle_wait_from_another_thread() {
    // What ft_runtime::Runtime does when an application thread submits a command while
    // the progress thread waits in the transport.
    use ft_runtime::Transport;
    const TIMEOUT: Duration = Duration::from_secs(20);
    let provider = provider();
    let ended = group(
        "waker",
        1,
        &provider,
        |_| {},
        |mut t| {
            let waker = t.waker()?;
            let start = Instant::now();
            thread::scope(|s| {
                s.spawn(|| {
                    thread::sleep(Duration::from_millis(300));
                    waker.wake();
                });
                while start.elapsed() < Duration::from_millis(250) {
                    t.wait(Duration::from_millis(10)).expect("wait");
                }
                t.wait(TIMEOUT).expect("wait");
            });
            Some(start.elapsed())
        },
    );
    match ended[0] {
        Some(after) => assert!(after < TIMEOUT / 2, "woke after {after:?}"),
        None => assert_ne!(provider, DEFAULT_PROVIDER, "tcp;ofi_rxm has a waker"),
    }
}

/// The defect: `OfiConfig::new` took frames up to 64 KiB, below the stack's full data
/// chunks, so a library user's large broadcast stalled (every full chunk arrived as
/// `Oversized`). A 4 MiB broadcast between transports built with `OfiConfig::new` and
/// nothing else must now complete, byte for byte.
#[test]
fn a_4_mib_broadcast_through_library_built_transports() {
    use ft_bcast::{BcastEvent, OutputSpec, PlanSpec, RankStack, StackEvent, Topology};
    use ft_core::detector::{DetectorConfig, DEFAULT_SPAN};
    use ft_runtime::Driver;

    const N: u32 = 3;
    const BYTES: usize = 4 << 20;
    let payload: Vec<u8> = (0..BYTES).map(|i| (i % 253) as u8).collect();
    let finished = AtomicUsize::new(0);
    let got = group(
        "4mib",
        N,
        &provider(),
        |_| {},
        |transport| {
            let me = transport.rank();
            let config = DetectorConfig {
                comm: 0,
                n: N,
                me,
                period: ft_core::Duration::from_millis(50),
                timeout: ft_core::Duration::from_millis(5000),
                phase: ft_core::Duration::ZERO,
                span: DEFAULT_SPAN,
            };
            let stack = RankStack::new(config, ft_core::Instant::ZERO);
            let mut driver = Driver::new(stack, transport, Instant::now());
            if me == 0 {
                let spec = PlanSpec::new(N, 0)
                    .with_topology(Topology::Chain)
                    .with_output(OutputSpec::new("A", BYTES as u64, vec![1, 2]));
                driver
                    .command(|stack, now| {
                        stack.start_broadcast(
                            now,
                            1,
                            ft_bcast::Bytes::new(),
                            spec,
                            vec![payload.clone()],
                        )
                    })
                    .expect("the transport works")
                    .expect("the broadcast starts");
            }
            let received = if me == 0 {
                None
            } else {
                driver
                    .run_until("the 4 MiB output", LIMIT, |stack, events| {
                        let released = events.drain(..).any(|(_, e)| {
                            matches!(e, StackEvent::Bcast(BcastEvent::Released { .. }))
                        });
                        released.then(|| {
                            stack
                                .broadcaster()
                                .and_then(|b| b.output(ft_bcast::TaskId::new(0, 1), 0))
                                .map(<[u8]>::to_vec)
                        })
                    })
                    .unwrap_or_else(|e| panic!("rank {me}: {e}"))
            };
            // Serve the others until every rank holds what it needs.
            finished.fetch_add(1, Ordering::SeqCst);
            driver
                .run_until("the others", LIMIT, |_, _| {
                    (finished.load(Ordering::SeqCst) == N as usize).then_some(())
                })
                .unwrap_or_else(|e| panic!("rank {me}: {e}"));
            assert_eq!(driver.stats().oversized, 0, "rank {me}: no frame too long");
            received
        },
    );
    assert_eq!(got[0], None);
    for (rank, output) in got.iter().enumerate().skip(1) {
        assert!(
            output.as_deref() == Some(&payload[..]),
            "rank {rank}: the output intact"
        );
    }
}

/// Which providers move large payloads by RMA here: each opens a one-rank job and says
/// whether it took `FI_RMA` (an endpoint that has not is opened for messages only). On
/// the two providers the other tests use, a 3-rank group also sends one payload from
/// rank 0 to ranks 1 and 2: both read it by RMA from one shared registration, and the
/// forced two-sided configuration offers nothing.
#[test]
fn providers_with_fi_rma_move_large_payloads_by_rma() {
    for provider in ["tcp;ofi_rxm", "sockets", "udp;ofi_rxd", "shm"] {
        let rendezvous = Rendezvous::new("rma-caps");
        let mut config = OfiConfig::new(1, 0, rendezvous.path());
        config.provider = provider.to_owned();
        match OfiTransport::open(config) {
            Ok(t) => eprintln!("{provider}: opens, RMA {}", t.uses_rma()),
            Err(e) => eprintln!("{provider}: does not open here: {e}"),
        }
    }
    const N: u32 = 3;
    let payload = Bytes::from(frame(0, 1, 7, 200_000));
    for provider in ["tcp;ofi_rxm", "sockets"] {
        for two_sided in [false, true] {
            let got = group(
                "rma-share",
                N,
                provider,
                |config| {
                    if two_sided {
                        config.rma_threshold = None;
                    }
                },
                |mut t| {
                    let me = t.rank();
                    assert!(t.uses_rma() != two_sided, "{provider}");
                    if me == 0 {
                        for to in 1..N {
                            t.send_parts(to, &payload[..12], &payload.slice(12..))
                                .expect("send_parts");
                        }
                    }
                    // The root is done when both receivers said done (nothing pending).
                    let mut frames = Vec::new();
                    drive(&mut t, "the payload", |t, inbox| {
                        frames.append(inbox);
                        (me == 0 || !frames.is_empty()) && t.pending_sends() == 0
                    });
                    // Serve the others' reads a little longer.
                    let linger = Instant::now();
                    drive(&mut t, "linger", |_, _| {
                        linger.elapsed() > Duration::from_millis(300)
                    });
                    if me != 0 {
                        assert_eq!(frames.len(), 1);
                        assert_eq!(frames[0].1, &payload[..], "rank {me}: payload differs");
                    }
                    t.stats()
                },
            );
            let root = got[0];
            eprintln!("{provider}, two-sided {two_sided}: root {root:?}");
            if two_sided {
                assert_eq!(root.rma_offered, 0);
            } else {
                assert_eq!(root.rma_offered, 2);
                assert_eq!(
                    root.rma_registrations_reused, 1,
                    "one registration, two reads"
                );
                for stats in &got[1..] {
                    assert_eq!((stats.rma_reads, stats.rma_bytes_read), (1, 200_000 - 12));
                }
            }
        }
    }
}
