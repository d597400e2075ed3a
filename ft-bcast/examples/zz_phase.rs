// TEMP phase timing (removed before hand-off).
#![allow(missing_docs)]
use std::hint::black_box;
use std::time::Instant;
const N: u32 = 1_000_000;
fn main() {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut coin = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state & 1 == 1 };
    let lists: Vec<Vec<u32>> = (0..8).map(|_| (1..N).filter(|_| coin()).collect()).collect();
    let n = N as usize;
    let mut best = [f64::MAX; 5];
    for _ in 0..25 {
        let t0 = Instant::now();
        let s: u64 = lists.iter().map(|l| l.iter().map(|&r| r as u64).sum::<u64>()).sum();
        black_box(s);
        let t1 = Instant::now();
        let mut masks = vec![0u8; n];
        for (j, l) in lists.iter().enumerate() {
            let bit = 1u8 << j;
            for &r in l { let m = masks.get_mut(r as usize).unwrap(); if *m & bit != 0 { panic!() } *m |= bit; }
        }
        let t2 = Instant::now();
        // branch-free mark with sentinel
        let mut m2 = vec![0u8; n + 1];
        let last = n;
        let mut bad = 0u8;
        for (j, l) in lists.iter().enumerate() {
            let bit = 1u8 << j;
            for &r in l {
                let i = (r as usize).min(last);
                let m = m2[i];
                bad |= (m & bit) | u8::from(i == last);
                m2[i] = m | bit;
            }
        }
        assert!(bad == 0);
        m2.pop();
        assert!(m2 == masks);
        let t3 = Instant::now();
        // histogram + first appearance order
        let mut counts = vec![0u32; 256];
        let mut order: Vec<u8> = Vec::new();
        for &m in masks.iter() {
            let c = &mut counts[m as usize];
            if *c == 0 { order.push(m); }
            *c += 1;
        }
        let t4 = Instant::now();
        let mut id_of = [u32::MAX; 256];
        let mut classes: Vec<Vec<u32>> = Vec::new();
        for &m in &order { if m != 0 { id_of[m as usize] = classes.len() as u32; classes.push(Vec::with_capacity(counts[m as usize] as usize)); } }
        // blocked fill
        const B: usize = 16384;
        let mut scratch = vec![0u32; B];
        let mut local = vec![0u32; 257];
        let mut start = 0;
        while start < n {
            let end = (start + B).min(n);
            let block = &masks[start..end];
            local.iter_mut().for_each(|c| *c = 0);
            for &m in block { local[m as usize + 1] += 1; }
            for k in 1..257 { local[k] += local[k - 1]; }
            let bounds: Vec<u32> = local.clone();
            for (i, &m) in block.iter().enumerate() { let o = &mut local[m as usize]; scratch[*o as usize] = (start + i) as u32; *o += 1; }
            for m in 1..256usize {
                let (a, b) = (bounds[m] as usize, bounds[m + 1] as usize);
                if a < b { classes[id_of[m] as usize].extend_from_slice(&scratch[a..b]); }
            }
            start = end;
        }
        let t5 = Instant::now();
        black_box(&classes);
        for (k, d) in [t1-t0, t2-t1, t3-t2, t4-t3, t5-t4].iter().enumerate() { best[k] = best[k].min(d.as_secs_f64() * 1e3); }
    }
    eprintln!("min ms: scan {:.2} mark {:.2} bfmark {:.2} hist {:.2} blockfill {:.2}", best[0], best[1], best[2], best[3], best[4]);
}
