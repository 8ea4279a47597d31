//! The one fault type of gradwire: a rank that failed, the kind of its
//! failure and what happened, carried unchanged from the communicator (a
//! [`CommError::Fault`](crate::CommError::Fault)) through the strategies to
//! the optimizer.
//!
//! A rank that fails between two collectives posts its [`FaultKind`] in
//! place of its next collective ([`crate::Communicator::post_fault`]); every
//! rank's call of that collective returns the same [`Fault`], naming the
//! lowest rank that posted one. Only the kind crosses the wire (as a
//! [`FaultKind::code`]); the failing rank's own description stays on it.

use gradwire_tensor::ErrorKind;

/// What kind of fault a rank posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultKind {
    /// A NaN or an infinity in a gradient (or a value computed from it).
    NonFinite,
    /// A bad call: an unknown parameter, a wrong shape, dtype, device or
    /// length, a capacity exceeded, a misuse of a mode.
    InvalidArgument,
    /// The optimizer's update failed.
    Optimizer,
    /// A strategy (AdaSum or a user's strategy) failed.
    Strategy,
    /// Anything else (a tensor operation, a codec).
    Other,
    /// The asynchronous lane of the posting rank is lost: a job of that
    /// rank panicked, so its lane (the communicator `run_async` jobs run
    /// on) is gone, and with it the lane of every rank. The one fault after
    /// which a communicator is *not* usable. Every backend returns exactly
    /// this fault ([`crate::CommError::lane_lost`]) to the peers' jobs that
    /// were waiting in, or later reach, a collective of the lane (LocalComm
    /// and MpiComm: a receive too), and to every job submitted afterwards
    /// on any rank (the panicking job itself returns
    /// [`crate::CommError::RankPanicked`]). See
    /// [`crate::Communicator::run_async`] for the whole failure model.
    LaneLost,
    /// A code of the caller's own, below [`FIRST_RESERVED_CODE`] and
    /// outside gradwire's (1..=5).
    Code(u32),
}

/// The first code reserved for gradwire-comm itself: a caller's
/// [`FaultKind::Code`] stays below it.
pub const FIRST_RESERVED_CODE: u32 = 0xFFFF_0000;

/// The wire code of [`FaultKind::LaneLost`].
const LANE_LOST_CODE: u32 = u32::MAX;

impl FaultKind {
    const NAMED: [FaultKind; 5] = [
        FaultKind::NonFinite,
        FaultKind::InvalidArgument,
        FaultKind::Optimizer,
        FaultKind::Strategy,
        FaultKind::Other,
    ];

    /// The code that crosses the wire for this kind (1..=5 for gradwire's
    /// kinds; a lost lane's is reserved, far above).
    pub fn code(self) -> u32 {
        match self {
            FaultKind::NonFinite => 1,
            FaultKind::InvalidArgument => 2,
            FaultKind::Optimizer => 3,
            FaultKind::Strategy => 4,
            FaultKind::Other => 5,
            FaultKind::LaneLost => LANE_LOST_CODE,
            FaultKind::Code(code) => code,
        }
    }

    /// The kind a received `code` stands for (any code is one).
    pub fn from_code(code: u32) -> FaultKind {
        match code {
            LANE_LOST_CODE => FaultKind::LaneLost,
            code => FaultKind::NAMED
                .into_iter()
                .find(|k| k.code() == code)
                .unwrap_or(FaultKind::Code(code)),
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultKind::NonFinite => f.write_str("non-finite value"),
            FaultKind::InvalidArgument => f.write_str("invalid argument"),
            FaultKind::Optimizer => f.write_str("optimizer error"),
            FaultKind::Strategy => f.write_str("strategy error"),
            FaultKind::Other => f.write_str("error"),
            FaultKind::LaneLost => f.write_str("lost asynchronous lane"),
            FaultKind::Code(code) => write!(f, "fault {code}"),
        }
    }
}

/// A fault that ended an operation on every rank: the lowest rank that
/// failed (`None` when the fault is in a value every rank computed alike,
/// such as an averaged gradient), the kind, and what happened (the failing
/// rank's own description on that rank; elsewhere, which rank reported it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct Fault {
    /// The lowest rank that failed, if one did.
    pub rank: Option<usize>,
    /// What kind of fault it was.
    pub kind: FaultKind,
    /// What happened; empty where nothing more than the kind is known (a
    /// communicator's fault).
    pub detail: String,
}

impl Fault {
    /// The fault `rank` posted, as every rank's collective returns it.
    pub fn posted(rank: usize, kind: FaultKind) -> Fault {
        Fault {
            rank: Some(rank),
            kind,
            detail: String::new(),
        }
    }

    /// What kind of failure this is: a lost lane is a lost peer (the
    /// communicator is unusable), any other fault an [`ErrorKind::Fault`].
    pub fn error_kind(&self) -> ErrorKind {
        match self.kind {
            FaultKind::LaneLost => ErrorKind::PeerLost,
            _ => ErrorKind::Fault,
        }
    }

    fn describe(&self) -> String {
        let on = self.rank.map_or_else(
            || "on every rank".to_owned(),
            |rank| format!("on rank {rank}"),
        );
        match (self.kind, self.detail.is_empty()) {
            (FaultKind::LaneLost, _) => format!(
                "asynchronous lane lost {on} (one of its jobs panicked): \
                 the asynchronous lane of every rank is unusable"
            ),
            (kind, true) => format!("{kind} {on}"),
            (kind, false) => format!("{kind} {on}: {}", self.detail),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_gradwires_stay_below_the_reserved_ones() {
        for kind in FaultKind::NAMED {
            assert_eq!(FaultKind::from_code(kind.code()), kind);
            assert!(kind.code() < 1 << 16);
        }
        assert_eq!(FaultKind::from_code(u32::MAX), FaultKind::LaneLost);
        assert_eq!(FaultKind::LaneLost.code(), u32::MAX);
        assert!(FaultKind::LaneLost.code() >= FIRST_RESERVED_CODE);
        for code in [0, 6, 7, 1 << 20] {
            assert_eq!(FaultKind::from_code(code), FaultKind::Code(code));
            assert_eq!(FaultKind::Code(code).code(), code);
        }
    }

    #[test]
    fn a_lost_lane_is_a_lost_peer_and_other_faults_are_faults() {
        assert_eq!(
            Fault::posted(2, FaultKind::LaneLost).error_kind(),
            ErrorKind::PeerLost
        );
        assert_eq!(
            Fault::posted(0, FaultKind::NonFinite).error_kind(),
            ErrorKind::Fault
        );
        assert_eq!(
            Fault::posted(1, FaultKind::Optimizer).to_string(),
            "optimizer error on rank 1"
        );
        let everywhere = Fault {
            rank: None,
            kind: FaultKind::NonFinite,
            detail: "the averaged gradient is not finite".into(),
        };
        assert_eq!(
            everywhere.to_string(),
            "non-finite value on every rank: the averaged gradient is not finite"
        );
    }
}
