//! Streaming DiLoCo's fragments: how the declared parameters are cut into
//! contiguous ranges, one implementation for the engine
//! (`gradwire_optim`'s streaming loop) and the cost model
//! ([`super::step_collectives`]).

use std::ops::Range;

/// Streaming DiLoCo's fragments: the declared parameters (of element
/// counts `lens`) cut into `fragments`
/// contiguous ranges as even in elements as whole tensors allow: fragment
/// `k` ends at the first parameter where the running count reaches `(k +
/// 1) / F` of the total, leaving at least one parameter to each later
/// fragment. `None` when there are fewer parameters than fragments.
pub fn fragment_ranges(lens: &[usize], fragments: usize) -> Option<Vec<Range<usize>>> {
    let fragments = fragments.max(1);
    if lens.len() < fragments {
        return None;
    }
    let total: u128 = lens.iter().map(|&n| n as u128).sum();
    let mut cuts = Vec::with_capacity(fragments);
    let (mut start, mut running) = (0usize, 0u128);
    for (i, &n) in lens.iter().enumerate() {
        running += n as u128;
        let k = cuts.len();
        if k + 1 == fragments {
            break;
        }
        // Enough left for the later fragments, and this one reached its share.
        let must_cut = lens.len() - (i + 1) == fragments - (k + 1);
        if must_cut || running * fragments as u128 >= total * (k as u128 + 1) {
            cuts.push(start..i + 1);
            start = i + 1;
        }
    }
    cuts.push(start..lens.len());
    Some(cuts)
}
