//! The time of one collective under the alpha-beta model: `p` ranks, `n`
//! bytes, a [`Link`] of latency alpha and `1 / beta` bytes per second.
//!
//! Three algorithms, each written from its published analysis:
//!
//! - [`Algorithm::Ring`]: the bandwidth-optimal algorithms of Thakur,
//!   Rabenseifner & Gropp, "Optimization of collective communication
//!   operations in MPICH" (IJHPCA 2005): ring reduce-scatter and
//!   all-gather, `(p - 1) alpha + (p - 1) / p n beta` each; all-reduce as
//!   the two, `2 (p - 1) alpha + 2 (p - 1) / p n beta` (what gradwire's
//!   LocalComm and MpiComm implement, and NCCL's ring); broadcast as a
//!   binomial scatter then a ring all-gather (van de Geijn's long-message
//!   broadcast, same paper): `(ceil(log2 p) + p - 1) alpha + 2 (p - 1) / p
//!   n beta`.
//! - [`Algorithm::Tree`]: latency-optimal trees. All-reduce is the
//!   pipelined double binary tree of Sanders, Speck & Träff, "Two-tree
//!   algorithms for full bandwidth broadcast, reduction and scan" (Parallel
//!   Computing 2009), which NCCL uses since 2.4: a reduction up two
//!   complementary binary trees (each carrying half the data, every rank an
//!   inner node of one and a leaf of the other) and a broadcast down them.
//!   Each rank sends `n` bytes in each phase, so the model is
//!   `2 ceil(log2 p) alpha + 2 n beta`; the pipeline's fill (a term in
//!   `sqrt(n log p alpha beta)` with the optimal segment size) is left out,
//!   which flatters the tree for mid-sized messages. Reduce-scatter and
//!   all-gather are recursive halving and Bruck's doubling (Thakur et al.):
//!   `ceil(log2 p) alpha + (p - 1) / p n beta` (exact for a power of two;
//!   MPICH falls back to a pairwise exchange for other `p`, which costs
//!   `(p - 1) alpha`); broadcast is the two-tree one,
//!   `ceil(log2 p) alpha + n beta`.
//! - [`Algorithm::Hierarchical`]: two levels, as Horovod's and NCCL's
//!   hierarchical all-reduce: a ring reduce-scatter inside each node of `g`
//!   ranks on the fast `intra` link, a ring all-reduce of the `n / g`
//!   shard among the `p / g` nodes on the network link (the `g` ranks of a
//!   node each run theirs at once, each on its own NIC, as on machines
//!   with one NIC per GPU; with one NIC shared by the node, give the link
//!   `1 / g` of its rate), then a ring all-gather inside the node.
//!   Reduce-scatter, all-gather and broadcast are split the same way.
//!   With `g = 1` it is [`Algorithm::Ring`]; with `p <= g` (one node) every
//!   collective is a ring on `intra`.
//!
//! In every algorithm a paired send-receive is `alpha + n beta` (full
//! duplex: the exchange's two messages pass each other), a barrier is a
//! dissemination barrier, `ceil(log2 p) alpha`, and one rank costs 0.

use super::Link;
use crate::error::{AlgoError, Result};
use crate::handle::Traffic;

/// How the collectives are carried out (see the module docs for each
/// formula and its source).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Algorithm {
    /// Bandwidth-optimal rings (Thakur et al. 2005).
    Ring,
    /// Latency-optimal trees: the double binary tree for all-reduce
    /// (Sanders et al. 2009), recursive halving and doubling otherwise.
    Tree,
    /// Two levels: inside nodes of `ranks_per_node` ranks on `intra`, and
    /// across nodes on the network link.
    Hierarchical {
        /// Ranks per node (`g`); the world size must be a multiple of it
        /// when it spans more than one node.
        ranks_per_node: usize,
        /// The link between two ranks of one node (NVLink, PCIe, shared
        /// memory).
        intra: Link,
    },
}

/// One collective operation and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// Every rank contributes `bytes` and receives the reduction of all.
    AllReduce {
        /// Bytes per rank.
        bytes: usize,
    },
    /// Every rank contributes `bytes` and receives the reduction of its
    /// `1 / p` chunk.
    ReduceScatter {
        /// Bytes of the whole vector each rank contributes.
        bytes: usize,
    },
    /// Every rank contributes `bytes / p` and receives all `bytes`.
    AllGather {
        /// Bytes of the gathered result.
        bytes: usize,
    },
    /// Every rank contributes its own number of bytes (at most
    /// `largest`), and receives all `total`.
    AllGatherVaried {
        /// The largest contribution, in bytes.
        largest: usize,
        /// The sum of all contributions.
        total: usize,
    },
    /// One rank's `bytes` to every rank.
    Broadcast {
        /// Bytes broadcast.
        bytes: usize,
    },
    /// Each rank sends `bytes` to one peer and receives as many from one
    /// (one of a sequence of pairwise exchanges).
    SendRecv {
        /// Bytes each way.
        bytes: usize,
    },
    /// A synchronisation without data.
    Barrier,
}

/// One collective of a step: the operation, the ranks it spans, what
/// rank 0 sends in it by gradwire's own accounting ([`Traffic`]), and how
/// often it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveCall {
    /// The operation.
    pub collective: Collective,
    /// Ranks taking part: the world, or the aligned group of consecutive
    /// ranks it runs in (AdaSum's levels); for a send-receive, the smallest
    /// aligned group that holds both partners, which decides whether it
    /// crosses the network under [`Algorithm::Hierarchical`].
    pub ranks: usize,
    /// Bytes rank 0 sends, as gradwire's [`Traffic`] counts them (the ring
    /// model's, whatever [`Algorithm`] times the call).
    pub sent: u64,
    /// The call runs once every `period` steps (at least 1): 1 for what
    /// every step sends, `H` for what DiLoCo sends at the end of a round of
    /// `H` steps. Per-step figures ([`crate::cost::communication_secs`],
    /// [`crate::cost::bytes_sent`]) count it `1 / period` times.
    pub period: u64,
    /// Which exchange of its period the call belongs to: 0, but for
    /// Streaming DiLoCo's fragment `k`'s calls (`k`). The calls of one
    /// `(period, exchange)` go out together ([`crate::cost::peak_bytes`]).
    pub exchange: u32,
    /// Inner steps its exchange runs under before anyone waits for it
    /// (Streaming DiLoCo's `τ`; 0 for a call waited for in its own step).
    pub hidden_steps: u32,
    /// The step (counting from 0) whose statistics first count the call:
    /// it is counted at that step and every `period` steps after it
    /// ([`crate::cost::sent_at_step`]). 0 for what every step sends; `H -
    /// 1` for DiLoCo's round; bucket `b` for partial averaging's; a
    /// Streaming DiLoCo fragment's merge step.
    pub first_step: u64,
}

impl CollectiveCall {
    /// A call of `collective` over `ranks` in which rank 0 sends `sent`.
    pub fn new(collective: Collective, ranks: usize, sent: u64) -> CollectiveCall {
        CollectiveCall {
            collective,
            ranks,
            sent,
            period: 1,
            exchange: 0,
            hidden_steps: 0,
            first_step: 0,
        }
    }

    /// This call, first counted at step `step` (see
    /// [`CollectiveCall::first_step`]).
    pub fn first_counted_at(self, step: u64) -> CollectiveCall {
        CollectiveCall {
            first_step: step,
            ..self
        }
    }

    /// Whether step `step` (counting from 0) counts this call.
    pub fn counted_at(&self, step: u64) -> bool {
        step >= self.first_step && (step - self.first_step).is_multiple_of(self.period.max(1))
    }

    /// This call, part of exchange `exchange` of its period, which runs
    /// under the next `hidden_steps` inner steps.
    pub fn in_exchange(self, exchange: u32, hidden_steps: u32) -> CollectiveCall {
        CollectiveCall {
            exchange,
            hidden_steps,
            ..self
        }
    }

    /// This call, run once every `steps` steps instead of every step (0 is
    /// taken as 1).
    pub fn once_every(self, steps: u64) -> CollectiveCall {
        CollectiveCall {
            period: steps.max(1),
            ..self
        }
    }

    /// An all-reduce of `bytes` on `ranks`, with [`Traffic::all_reduce`]'s
    /// count (`2 (p - 1) / p` of the bytes, rounded down per call).
    pub fn all_reduce(bytes: usize, ranks: usize) -> CollectiveCall {
        CollectiveCall::new(
            Collective::AllReduce { bytes },
            ranks,
            Traffic::all_reduce(bytes, ranks).sent,
        )
    }
}

/// `ceil(log2 p)` for `p >= 1`.
fn log2_ceil(p: usize) -> f64 {
    f64::from(usize::BITS - (p.max(1) - 1).leading_zeros())
}

/// The ring formulas on `p` ranks over `link`.
fn ring(collective: &Collective, p: usize, link: &Link) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let (a, inv) = (link.latency_s, 1.0 / link.bytes_per_s);
    let pf = p as f64;
    let frac = (pf - 1.0) / pf;
    match *collective {
        Collective::AllReduce { bytes } => 2.0 * (pf - 1.0) * a + 2.0 * frac * bytes as f64 * inv,
        Collective::ReduceScatter { bytes } | Collective::AllGather { bytes } => {
            (pf - 1.0) * a + frac * bytes as f64 * inv
        }
        // Each of the p - 1 rounds forwards one contribution per rank and
        // lasts as long as the largest in flight.
        Collective::AllGatherVaried { largest, .. } => (pf - 1.0) * (a + largest as f64 * inv),
        Collective::Broadcast { bytes } => {
            (log2_ceil(p) + pf - 1.0) * a + 2.0 * frac * bytes as f64 * inv
        }
        Collective::SendRecv { bytes } => link.message_secs(bytes as f64),
        Collective::Barrier => log2_ceil(p) * a,
    }
}

/// The tree formulas on `p` ranks over `link`.
fn tree(collective: &Collective, p: usize, link: &Link) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let (a, inv) = (link.latency_s, 1.0 / link.bytes_per_s);
    let pf = p as f64;
    let depth = log2_ceil(p);
    match *collective {
        Collective::AllReduce { bytes } => 2.0 * depth * a + 2.0 * bytes as f64 * inv,
        Collective::ReduceScatter { bytes } | Collective::AllGather { bytes } => {
            depth * a + (pf - 1.0) / pf * bytes as f64 * inv
        }
        // What the rank that receives most (the smallest contributor)
        // receives, bounded by `p - 1` of the largest and by the total
        // (the exact figure needs every contribution).
        Collective::AllGatherVaried { largest, total } => {
            let received = largest.saturating_mul(p - 1).min(total);
            depth * a + received as f64 * inv
        }
        Collective::Broadcast { bytes } => depth * a + bytes as f64 * inv,
        Collective::SendRecv { bytes } => link.message_secs(bytes as f64),
        Collective::Barrier => depth * a,
    }
}

/// The two-level formulas: `p` ranks in nodes of `g`, `intra` inside a
/// node, `link` across nodes.
fn hierarchical(
    collective: &Collective,
    p: usize,
    g: usize,
    intra: &Link,
    link: &Link,
) -> Result<f64> {
    if g == 0 {
        return Err(AlgoError::InvalidArgument(
            "hierarchical: ranks_per_node must be at least 1".into(),
        ));
    }
    intra.validate()?;
    if p <= 1 {
        return Ok(0.0);
    }
    if p <= g {
        return Ok(ring(collective, p, intra));
    }
    if !p.is_multiple_of(g) {
        return Err(AlgoError::InvalidArgument(format!(
            "hierarchical: {p} ranks are not whole nodes of {g}"
        )));
    }
    let nodes = p / g;
    // A shard of `bytes` per rank of a node: what each of its g lanes
    // carries across the network.
    let shard = |bytes: usize| bytes.div_ceil(g);
    Ok(match *collective {
        Collective::AllReduce { bytes } => {
            ring(&Collective::ReduceScatter { bytes }, g, intra)
                + ring(
                    &Collective::AllReduce {
                        bytes: shard(bytes),
                    },
                    nodes,
                    link,
                )
                + ring(&Collective::AllGather { bytes }, g, intra)
        }
        Collective::ReduceScatter { bytes } => {
            ring(&Collective::ReduceScatter { bytes }, g, intra)
                + ring(
                    &Collective::ReduceScatter {
                        bytes: shard(bytes),
                    },
                    nodes,
                    link,
                )
        }
        Collective::AllGather { bytes } => {
            ring(
                &Collective::AllGather {
                    bytes: shard(bytes),
                },
                nodes,
                link,
            ) + ring(&Collective::AllGather { bytes }, g, intra)
        }
        // Across nodes first (each lane gathers its peers' contributions),
        // then inside the node (each rank's lane holds up to `nodes` of
        // them).
        Collective::AllGatherVaried { largest, total } => {
            let lane = Collective::AllGatherVaried {
                largest,
                total: shard(total),
            };
            let node = Collective::AllGatherVaried {
                largest: largest.saturating_mul(nodes).min(total),
                total,
            };
            ring(&lane, nodes, link) + ring(&node, g, intra)
        }
        Collective::Broadcast { bytes } => {
            ring(&Collective::Broadcast { bytes }, nodes, link)
                + ring(&Collective::Broadcast { bytes }, g, intra)
        }
        Collective::SendRecv { bytes } => link.message_secs(bytes as f64),
        Collective::Barrier => {
            ring(&Collective::Barrier, g, intra) + ring(&Collective::Barrier, nodes, link)
        }
    })
}

/// Seconds `call` takes on a world of `world` ranks over `link` under
/// `algorithm`. The call's own `ranks` (at most `world`) are the `p` of
/// the formulas; under [`Algorithm::Hierarchical`] a call on a group no
/// larger than a node, and a send-receive whose partners share a node,
/// run on the intra-node link.
pub fn collective_secs(
    call: &CollectiveCall,
    world: usize,
    link: &Link,
    algorithm: &Algorithm,
) -> Result<f64> {
    link.validate()?;
    if call.ranks == 0 || call.ranks > world {
        return Err(AlgoError::InvalidArgument(format!(
            "a collective on {} ranks in a world of {world}",
            call.ranks
        )));
    }
    let p = call.ranks;
    match algorithm {
        Algorithm::Ring => Ok(ring(&call.collective, p, link)),
        Algorithm::Tree => Ok(tree(&call.collective, p, link)),
        Algorithm::Hierarchical {
            ranks_per_node,
            intra,
        } => hierarchical(&call.collective, p, *ranks_per_node, intra, link),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::tests::refused;
    use proptest::prelude::*;

    fn link() -> Link {
        Link::new(5e-6, 1.25e9).unwrap()
    }

    fn secs(c: Collective, p: usize, alg: &Algorithm) -> f64 {
        collective_secs(&CollectiveCall::new(c, p, 0), p, &link(), alg).unwrap()
    }

    #[test]
    fn log2_ceil_is_exact() {
        let cases = [
            (1, 0.0),
            (2, 1.0),
            (3, 2.0),
            (4, 2.0),
            (5, 3.0),
            (1024, 10.0),
            (1025, 11.0),
        ];
        for (p, want) in cases {
            assert_eq!(log2_ceil(p), want, "{p}");
        }
    }

    #[test]
    fn bad_calls_and_algorithms_are_errors() {
        let call = CollectiveCall::all_reduce(1024, 8);
        refused(
            collective_secs(&call, 4, &link(), &Algorithm::Ring),
            "a collective on 8 ranks in a world of 4",
        );
        let zero = CollectiveCall::new(Collective::Barrier, 0, 0);
        refused(
            collective_secs(&zero, 4, &link(), &Algorithm::Ring),
            "a collective on 0 ranks in a world of 4",
        );
        let bad_link = Link {
            latency_s: -1.0,
            ..link()
        };
        refused(
            collective_secs(&call, 8, &bad_link, &Algorithm::Ring),
            "latency must be finite and at least 0 s, got -1",
        );
        let odd = Algorithm::Hierarchical {
            ranks_per_node: 3,
            intra: link(),
        };
        refused(
            collective_secs(&call, 8, &link(), &odd),
            "8 ranks are not whole nodes of 3",
        );
        let zero_g = Algorithm::Hierarchical {
            ranks_per_node: 0,
            intra: link(),
        };
        refused(
            collective_secs(&call, 8, &link(), &zero_g),
            "ranks_per_node must be at least 1",
        );
    }

    #[test]
    fn one_node_runs_on_the_intra_link() {
        let fast = Link::new(1e-6, 100e9).unwrap();
        let alg = Algorithm::Hierarchical {
            ranks_per_node: 8,
            intra: fast,
        };
        let c = Collective::AllReduce { bytes: 1 << 20 };
        let t = secs(c, 4, &alg);
        assert!((t - ring(&c, 4, &fast)).abs() < 1e-15);
    }

    fn any_collective() -> impl Strategy<Value = Collective> {
        (0usize..1 << 28, 0usize..1 << 24, 0usize..7).prop_map(|(n, m, k)| match k {
            0 => Collective::AllReduce { bytes: n },
            1 => Collective::ReduceScatter { bytes: n },
            2 => Collective::AllGather { bytes: n },
            3 => Collective::AllGatherVaried {
                largest: m,
                total: n.max(m),
            },
            4 => Collective::Broadcast { bytes: n },
            5 => Collective::SendRecv { bytes: n },
            _ => Collective::Barrier,
        })
    }

    fn with_bytes(c: Collective, n: usize) -> Collective {
        match c {
            Collective::AllReduce { .. } => Collective::AllReduce { bytes: n },
            Collective::ReduceScatter { .. } => Collective::ReduceScatter { bytes: n },
            Collective::AllGather { .. } => Collective::AllGather { bytes: n },
            Collective::AllGatherVaried { largest, total } => Collective::AllGatherVaried {
                largest: largest.max(n / 8),
                total: total.max(n),
            },
            Collective::Broadcast { .. } => Collective::Broadcast { bytes: n },
            Collective::SendRecv { .. } => Collective::SendRecv { bytes: n },
            Collective::Barrier => Collective::Barrier,
        }
    }

    proptest! {
        #[test]
        fn ring_and_tree_all_reduce_match_the_formulas(
            n in 0usize..1 << 30, p in 1usize..2048,
            alpha in 0.0f64..1e-3, rate in 1e6f64..1e11,
        ) {
            let link = Link::new(alpha, rate).unwrap();
            let call = CollectiveCall::all_reduce(n, p);
            let (nf, pf) = (n as f64, p as f64);
            let ring_want = if p == 1 { 0.0 } else {
                2.0 * (pf - 1.0) * alpha + 2.0 * (pf - 1.0) / pf * nf / rate
            };
            let tree_want = if p == 1 { 0.0 } else {
                2.0 * pf.log2().ceil() * alpha + 2.0 * nf / rate
            };
            let r = collective_secs(&call, p, &link, &Algorithm::Ring).unwrap();
            let t = collective_secs(&call, p, &link, &Algorithm::Tree).unwrap();
            prop_assert!((r - ring_want).abs() <= 1e-12 * ring_want.max(1e-9));
            prop_assert!((t - tree_want).abs() <= 1e-12 * tree_want.max(1e-9));
        }

        #[test]
        fn one_rank_costs_nothing(c in any_collective()) {
            for alg in [Algorithm::Ring, Algorithm::Tree,
                        Algorithm::Hierarchical { ranks_per_node: 4, intra: link() }] {
                prop_assert_eq!(secs(c, 1, &alg), 0.0);
            }
        }

        #[test]
        fn time_grows_with_bytes_and_ranks(
            c in any_collective(), n in 0usize..1 << 26, extra in 0usize..1 << 26,
            p in 1usize..512, q in 0usize..512, g in 1usize..9,
        ) {
            let hier = Algorithm::Hierarchical { ranks_per_node: g, intra: Link::new(1e-6, 50e9).unwrap() };
            for alg in [Algorithm::Ring, Algorithm::Tree] {
                let small = secs(with_bytes(c, n), p, &alg);
                let large = secs(with_bytes(c, n + extra), p, &alg);
                prop_assert!(small <= large, "{alg:?} {c:?}: {small} > {large}");
                let more = secs(with_bytes(c, n), p + q, &alg);
                prop_assert!(small <= more * (1.0 + 1e-12), "{alg:?} {c:?} p {p}: {small} > {more}");
            }
            // Hierarchical: in bytes at any whole number of nodes.
            let p_nodes = g * (1 + p % 64);
            let small = secs(with_bytes(c, n), p_nodes, &hier);
            let large = secs(with_bytes(c, n + extra), p_nodes, &hier);
            prop_assert!(small <= large, "{c:?}: {small} > {large}");
        }

        #[test]
        fn hierarchical_with_one_rank_per_node_is_the_ring(
            c in any_collective(), p in 1usize..1100,
        ) {
            let hier = Algorithm::Hierarchical { ranks_per_node: 1, intra: Link::new(0.0, 1e12).unwrap() };
            let a = secs(c, p, &hier);
            let b = secs(c, p, &Algorithm::Ring);
            prop_assert!((a - b).abs() <= 1e-12 * b.max(1e-9), "{c:?} p {p}: {a} vs {b}");
        }

        #[test]
        fn hierarchical_all_reduce_is_its_three_stages(
            n in 0usize..1 << 28, nodes in 2usize..128, g in 1usize..9,
        ) {
            let intra = Link::new(1e-6, 100e9).unwrap();
            let net = link();
            let p = nodes * g;
            let alg = Algorithm::Hierarchical { ranks_per_node: g, intra };
            let call = CollectiveCall::all_reduce(n, p);
            let got = collective_secs(&call, p, &net, &alg).unwrap();
            let (gf, nf, bytes) = (g as f64, nodes as f64, n as f64);
            let shard = n.div_ceil(g) as f64;
            let intra_part = if g == 1 { 0.0 } else {
                2.0 * ((gf - 1.0) * 1e-6 + (gf - 1.0) / gf * bytes / 100e9)
            };
            let inter = 2.0 * (nf - 1.0) * 5e-6 + 2.0 * (nf - 1.0) / nf * shard / 1.25e9;
            let want = intra_part + inter;
            prop_assert!((got - want).abs() <= 1e-12 * want.max(1e-9), "{got} vs {want}");
        }
    }
}
