//! A tiled right-looking Cholesky `A = LLᵀ` of a random SPD matrix of `T × T` tiles of
//! `B × B` doubles, in PaRSEC's four task classes:
//!
//! ```text
//! for k in 0..T:
//!     POTRF(k):      L[k][k] = chol(A[k][k])
//!     TRSM(m, k):    L[m][k] = A[m][k] · L[k][k]⁻ᵀ                  m > k
//!     SYRK(m, k):    A[m][m] -= L[m][k] · L[m][k]ᵀ                  m > k
//!     GEMM(m, n, k): A[m][n] -= L[m][k] · L[n][k]ᵀ                  m > n > k
//! ```
//!
//! Tile `(i, j)` and every task writing it are owned 2D block-cyclically
//! ([`block_cyclic`]). The first task on a tile (`k = 0`) generates the tile from the
//! seed itself, so no task reads a whole matrix. Kernels are faer's, sequential
//! ([`Par::Seq`]): a task's bytes depend on its inputs only, wherever it runs.
//!
//! Tiles travel as `B × B` little-endian `f64`, column-major. The final data are the
//! factor's tiles, column by column (`L[j][j], L[j+1][j], …`), upper parts of the
//! diagonal tiles zeroed; from them the collector computes `‖A − LLᵀ‖_F / ‖A‖_F`.

use std::collections::HashMap;

use faer::linalg::matmul::matmul;
use faer::linalg::triangular_solve::solve_lower_triangular_in_place;
use faer::{Accum, Mat, Par, Side};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::graph::{Class, Graph, GraphBuilder, OutputId, Task};
use crate::workloads::{block_cyclic, Finish, Workload};

/// The Cholesky workload: see the [module docs](self).
#[derive(Debug)]
pub struct Cholesky {
    tiles: u32,
    tile: usize,
    seed: u64,
    graph: Graph,
}

impl Cholesky {
    /// `tiles × tiles` tiles of `tile × tile` (both ≥ 1) on `n` ranks.
    pub fn new(tiles: u32, tile: u32, seed: u64, n: u32) -> Self {
        let bytes = u64::from(tile) * u64::from(tile) * 8;
        let owner = |i: u32, j: u32| block_cyclic(i, j, n);
        let mut b = GraphBuilder::new();
        // The latest version of each tile of A, and each finished tile of L.
        let mut a: HashMap<(u32, u32), OutputId> = HashMap::new();
        let mut l: HashMap<(u32, u32), OutputId> = HashMap::new();
        let with = |a: Option<&OutputId>, rest: &[OutputId]| -> Vec<OutputId> {
            a.into_iter().copied().chain(rest.iter().copied()).collect()
        };
        for k in 0..tiles {
            let t = b.add(
                Class::Potrf,
                [k, 0, 0],
                owner(k, k),
                with(a.get(&(k, k)), &[]),
                &[bytes],
            );
            l.insert((k, k), b.output_of(t, 0));
            for m in k + 1..tiles {
                let t = b.add(
                    Class::Trsm,
                    [m, k, 0],
                    owner(m, k),
                    with(a.get(&(m, k)), &[l[&(k, k)]]),
                    &[bytes],
                );
                l.insert((m, k), b.output_of(t, 0));
            }
            for m in k + 1..tiles {
                let t = b.add(
                    Class::Syrk,
                    [m, k, 0],
                    owner(m, m),
                    with(a.get(&(m, m)), &[l[&(m, k)]]),
                    &[bytes],
                );
                a.insert((m, m), b.output_of(t, 0));
                for n2 in k + 1..m {
                    let t = b.add(
                        Class::Gemm,
                        [m, n2, k],
                        owner(m, n2),
                        with(a.get(&(m, n2)), &[l[&(m, k)], l[&(n2, k)]]),
                        &[bytes],
                    );
                    a.insert((m, n2), b.output_of(t, 0));
                }
            }
        }
        let finals = (0..tiles)
            .flat_map(|j| (j..tiles).map(move |i| (i, j)))
            .map(|ij| l[&ij])
            .collect();
        Cholesky {
            tiles,
            tile: tile as usize,
            seed,
            graph: b.finish(finals),
        }
    }

    /// The order of the matrix.
    pub fn order(&self) -> usize {
        self.tiles as usize * self.tile
    }

    /// Tile `(i, j)` of `A`, `i ≥ j`: symmetric, uniform in `[-1, 1)`, plus the order
    /// on the diagonal (so `A` is diagonally dominant, hence SPD).
    fn initial_tile(&self, i: u32, j: u32) -> Mat<f64> {
        let b = self.tile;
        let stream = (u64::from(i) << 32) | u64::from(j);
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(stream);
        let mut m = Mat::<f64>::zeros(b, b);
        for c in 0..b {
            for r in 0..b {
                m[(r, c)] = rng.random_range(-1.0..1.0);
            }
        }
        if i == j {
            let order = self.order() as f64;
            for c in 0..b {
                for r in 0..c {
                    m[(r, c)] = m[(c, r)];
                }
                m[(c, c)] += order;
            }
        }
        m
    }

    fn tile_of(&self, bytes: &[u8]) -> Mat<f64> {
        let b = self.tile;
        Mat::from_fn(b, b, |r, c| {
            let at = (c * b + r) * 8;
            bytes
                .get(at..at + 8)
                .map(|w| f64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
                .unwrap_or(0.0)
        })
    }

    fn bytes_of(&self, m: &Mat<f64>) -> Vec<u8> {
        let b = self.tile;
        let mut out = Vec::with_capacity(b * b * 8);
        for c in 0..b {
            for r in 0..b {
                out.extend_from_slice(&m[(r, c)].to_le_bytes());
            }
        }
        out
    }

    /// The whole `A` (both triangles).
    fn matrix(&self) -> Mat<f64> {
        let (t, b) = (self.tiles, self.tile);
        let mut a = Mat::<f64>::zeros(self.order(), self.order());
        for j in 0..t {
            for i in j..t {
                let tile = self.initial_tile(i, j);
                let (i0, j0) = (i as usize * b, j as usize * b);
                for c in 0..b {
                    for r in 0..b {
                        a[(i0 + r, j0 + c)] = tile[(r, c)];
                        a[(j0 + c, i0 + r)] = tile[(r, c)];
                    }
                }
            }
        }
        a
    }
}

/// `chol(a)`, lower, upper part zeroed; NaNs if `a` is not positive definite.
fn potrf(a: &Mat<f64>) -> Mat<f64> {
    let b = a.nrows();
    match a.llt(Side::Lower) {
        Ok(llt) => Mat::from_fn(b, b, |r, c| if r >= c { llt.L()[(r, c)] } else { 0.0 }),
        Err(_) => Mat::from_fn(b, b, |_, _| f64::NAN),
    }
}

impl Workload for Cholesky {
    fn name(&self) -> &'static str {
        "cholesky"
    }

    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn run(&self, task: &Task, inputs: &[&[u8]]) -> Vec<Vec<u8>> {
        let [p0, p1, k] = task.params;
        // With k > 0 the first input is the tile as earlier updates left it; the first
        // task on a tile (k = 0) generates it.
        let (first_k, rest) = match task.class {
            Class::Potrf => (p0, inputs),
            Class::Trsm | Class::Syrk => (p1, inputs),
            _ => (k, inputs),
        };
        let (mut a, rest) = if first_k > 0 {
            (self.tile_of(rest[0]), &rest[1..])
        } else {
            let (i, j) = match task.class {
                Class::Potrf => (p0, p0),
                Class::Syrk => (p0, p0),
                _ => (p0, p1),
            };
            (self.initial_tile(i, j), rest)
        };
        let out = match task.class {
            Class::Potrf => potrf(&a),
            Class::Trsm => {
                let lkk = self.tile_of(rest[0]);
                // X · Lᵀ = A  ⇔  L · Xᵀ = Aᵀ.
                solve_lower_triangular_in_place(lkk.as_ref(), a.as_mut().transpose_mut(), Par::Seq);
                a
            }
            Class::Syrk => {
                let lmk = self.tile_of(rest[0]);
                matmul(
                    a.as_mut(),
                    Accum::Add,
                    lmk.as_ref(),
                    lmk.transpose(),
                    -1.0,
                    Par::Seq,
                );
                a
            }
            _ => {
                let lmk = self.tile_of(rest[0]);
                let lnk = self.tile_of(rest[1]);
                matmul(
                    a.as_mut(),
                    Accum::Add,
                    lmk.as_ref(),
                    lnk.transpose(),
                    -1.0,
                    Par::Seq,
                );
                a
            }
        };
        vec![self.bytes_of(&out)]
    }

    fn finish(&self, finals: &[&[u8]]) -> Finish {
        let (t, b) = (self.tiles, self.tile);
        let nn = self.order();
        let mut l = Mat::<f64>::zeros(nn, nn);
        let mut next = finals.iter();
        for j in 0..t {
            for i in j..t {
                let tile = self.tile_of(next.next().copied().unwrap_or(&[]));
                let (i0, j0) = (i as usize * b, j as usize * b);
                for c in 0..b {
                    for r in 0..b {
                        l[(i0 + r, j0 + c)] = tile[(r, c)];
                    }
                }
            }
        }
        let a = self.matrix();
        let mut diff = a.clone();
        matmul(
            diff.as_mut(),
            Accum::Add,
            l.as_ref(),
            l.transpose(),
            -1.0,
            Par::Seq,
        );
        let residual = diff.norm_l2() / a.norm_l2();
        let n = nn as f64;
        Finish {
            lines: vec![format!(
                "cholesky: {t}×{t} tiles of {b}×{b} (order {nn}), residual {residual:.3e}"
            )],
            residual: Some(residual),
            flops: Some(n * n * n / 3.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the graph in task order on one rank.
    fn run_all(w: &Cholesky) -> Vec<Vec<u8>> {
        let g = w.graph();
        let mut data: Vec<Vec<u8>> = vec![Vec::new(); g.outputs.len()];
        for task in &g.tasks[..g.work_tasks()] {
            let inputs: Vec<&[u8]> = task.inputs.iter().map(|&o| &data[o as usize][..]).collect();
            let outs = w.run(task, &inputs);
            for (o, bytes) in task.output_ids().zip(outs) {
                data[o as usize] = bytes;
            }
        }
        let collector = g.task(g.collector());
        collector
            .inputs
            .iter()
            .map(|&o| data[o as usize].clone())
            .collect()
    }

    #[test]
    fn the_graph_has_the_classic_task_counts() {
        let w = Cholesky::new(8, 4, 1, 6);
        // T + T(T-1)/2 TRSM + T(T-1)/2 SYRK + C(T,3) GEMM.
        assert_eq!(w.graph().work_tasks(), 8 + 28 + 28 + 56);
    }

    #[test]
    fn the_factor_reproduces_the_matrix() {
        let w = Cholesky::new(4, 8, 7, 1);
        let finals = run_all(&w);
        let refs: Vec<&[u8]> = finals.iter().map(|f| &f[..]).collect();
        let finish = w.finish(&refs);
        let residual = finish.residual.unwrap();
        assert!(residual <= 1e-14, "residual {residual}");
    }
}
