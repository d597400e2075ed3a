// TEMP phase timing (removed before hand-off).
#![allow(missing_docs)]
use std::hint::black_box;
use std::time::Instant;
const N: u32 = 1_000_000;
fn main() {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut coin = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state & 1 == 1 };
    let lists: Vec<Vec<u32>> = (0..8).map(|_| (1..N).filter(|_| coin()).collect()).collect();
    for _ in 0..8 {
        let t0 = Instant::now();
        let s: u64 = lists.iter().map(|l| l.iter().map(|&r| r as u64).sum::<u64>()).sum();
        black_box(s);
        let t1 = Instant::now();
        let mut masks = vec![0u8; N as usize];
        for (j, l) in lists.iter().enumerate() {
            let bit = 1u8 << j;
            for &r in l { let m = masks.get_mut(r as usize).unwrap(); if *m & bit != 0 { panic!() } *m |= bit; }
        }
        let t2 = Instant::now();
        let mut ids = [0u32; 256]; let mut next = 1; let mut sizes = vec![0u32; 256];
        for w in masks.iter_mut() { let s = &mut ids[*w as usize]; if *s == 0 && *w != 0 { *s = next; next += 1 } sizes[*s as usize] += 1; *w = *s as u8; }
        let t3 = Instant::now();
        let mut classes: Vec<Vec<u32>> = (1..next as usize).map(|i| Vec::with_capacity(sizes[i] as usize)).collect();
        let t4 = Instant::now();
        for (r, &id) in masks.iter().enumerate() { if id != 0 { classes[id as usize - 1].push(r as u32) } }
        let t5 = Instant::now();
        black_box(&classes);
        // alternative: one flat array (counting sort)
        let mut flat = vec![0u32; N as usize];
        let mut off = vec![0u32; 257]; let mut acc = 0; for i in 0..256 { off[i] = acc; acc += sizes[i]; }
        let t6 = Instant::now();
        for (r, &id) in masks.iter().enumerate() { let o = &mut off[id as usize]; flat[*o as usize] = r as u32; *o += 1; }
        let t7 = Instant::now();
        black_box(&flat);
        let mut off2 = vec![0u32; 257]; let mut acc = 0; for i in 0..256 { off2[i] = acc; acc += sizes[i]; }
        let t8 = Instant::now();
        for (r, &id) in masks.iter().enumerate() { let o = &mut off2[id as usize]; flat[*o as usize] = r as u32; *o += 1; }
        let t9 = Instant::now();
        black_box(&flat);
        let mut seq = 0u64;
        for &id in masks.iter() { seq += off2[id as usize] as u64; }
        black_box(seq);
        let t10 = Instant::now();
        eprintln!("flatfill-touched {:?} gather {:?}", t9-t8, t10-t9);
        drop(classes);
        eprintln!("scan {:?} mark {:?} relabel {:?} alloc {:?} fill {:?} | flatfill {:?}", t1-t0, t2-t1, t3-t2, t4-t3, t5-t4, t7-t6);
    }
}
