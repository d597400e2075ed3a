// TEMP timing harness (removed before hand-off).
use std::hint::black_box;
use std::time::{Duration, Instant};
use ft_bcast::{refine, OutputSpec, Plan, PlanSpec, Strategy, Topology};
const N: u32 = 1_000_000;
fn spec() -> PlanSpec {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut coin = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state & 1 == 1 };
    let mut spec = PlanSpec::new(N, 0).with_topology(Topology::Binomial);
    let m: usize = std::env::var("M").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    for j in 0..m {
        let dests: Vec<u32> = (1..N).filter(|_| coin()).collect();
        spec.outputs.push(OutputSpec::new(format!("o{j}"), 4096 << (j % 16), dests));
    }
    spec
}
fn med(mut f: impl FnMut() -> Duration) -> Duration {
    let mut v: Vec<Duration> = (0..21).map(|_| f()).collect(); v.sort(); v[10]
}
fn main() {
    let spec = spec();
    let sum = med(|| { let t = Instant::now(); black_box(spec.outputs.iter().map(|o| o.dests.iter().map(|&r| r as u64).sum::<u64>()).sum::<u64>()); t.elapsed() });
    let lists: Vec<&[u32]> = spec.outputs.iter().map(|o| &o.dests[..]).collect();
    let rf = med(|| { let t = Instant::now(); let p = refine(N, black_box(&lists)).unwrap(); let e = t.elapsed(); drop(black_box(p)); e });
    eprintln!("scan_sum {sum:.2?}  refine {rf:.2?} = {:.2}x", rf.as_secs_f64() / sum.as_secs_f64());
    let only: Option<String> = std::env::var("ONLY").ok();
    for s in Strategy::ALL {
        if only.as_deref().is_some_and(|o| o != s.name()) { continue; }
        let sp = spec.clone().with_strategy(s);
        let b = med(|| { let i = sp.clone(); let t = Instant::now(); let p = Plan::build(black_box(i)).unwrap(); let e = t.elapsed(); drop(black_box(p)); e });
        eprintln!("{s:<22} {b:.2?} = {:.2}x", b.as_secs_f64() / sum.as_secs_f64());
    }
}
