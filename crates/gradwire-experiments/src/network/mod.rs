//! Shaped networks between network namespaces, so that a run's bytes cross
//! a real network stack at a chosen rate (`--network 1gbit`).
//!
//! The topology is a switched cluster: one namespace per rank, each with
//! one veth link (`eth0`, `10.77.0.<rank + 1>/24`) into a bridge that lives
//! in a hub namespace of its own. Both ends of every link are shaped with a
//! token-bucket filter (`tc ... tbf`): a rank's uploads by its `eth0`, its
//! downloads by the bridge port, as a full-duplex NIC and its switch port.
//! Nothing is routed out: the namespaces have no other interface, so the
//! traffic never leaves the bridge, and two runs at once do not see each
//! other (each has its own namespaces, named after its process id).
//!
//! Every namespace is removed when the [`ShapedNetwork`] drops, on every
//! exit path of the CLI (an error, Ctrl-C or SIGTERM: see `launch.rs`);
//! processes still inside are killed first, since a namespace with a
//! process in it outlives `ip netns delete`. Namespaces left by a run that
//! was killed outright (SIGKILL) are found by their name and removed by the
//! next run.
//!
//! Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for namespaces), `ip` and
//! `tc` (Debian's iproute2) and the kernel's `sch_tbf`; netem is not used.

use crate::error::{ExperimentError, Result};
use std::net::Ipv4Addr;
use std::process::Command;

mod launch;

pub use launch::{MpiLaunch, NetworkArgs, OPEN_MPI_SHARED_CORES, run_shaped, run_under_mpi};

/// The subnet of every run's bridge (private to its namespaces).
pub const SUBNET: &str = "10.77.0.0/24";

/// The prefix of every namespace this module makes: `gwnet<pid>h` (the
/// hub) and `gwnet<pid>r<rank>`.
const PREFIX: &str = "gwnet";

/// The most ranks one bridge subnet addresses.
pub const MAX_RANKS: usize = 250;

/// A link rate: bits per second, from 100 Mbit/s to 100 Gbit/s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Bits per second.
    pub bits_per_s: u64,
}

impl Rate {
    /// Parses any positive rate: `400kbit`, `100mbit`, `2.5gbit`, `1tbit`
    /// (tc's units, powers of 1000; also `Mbit/s`, a bare prefix `2.5G`,
    /// case-insensitive). Bytes (`mbps`, `gbyte`) are refused rather than
    /// guessed: tc reads `mbps` as megabytes, most people as megabits.
    pub fn any(text: &str) -> Result<Rate> {
        let bad = |why: &str| ExperimentError::Usage(format!("rate {text:?}: {why}"));
        let lower = text.trim().to_ascii_lowercase();
        let lower = lower.strip_suffix("/s").unwrap_or(&lower);
        let split = lower
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(lower.len());
        let (number, unit) = lower.split_at(split);
        let scale = match unit.trim() {
            "k" | "kbit" => 1e3,
            "m" | "mbit" => 1e6,
            "g" | "gbit" => 1e9,
            "t" | "tbit" => 1e12,
            _ => return Err(bad("give a unit: kbit, mbit, gbit or tbit (e.g. 10gbit)")),
        };
        let bits = number
            .parse::<f64>()
            .map_err(|_| bad("not a number before the unit"))?
            * scale;
        if !(bits.is_finite() && bits >= 1.0 && bits <= u64::MAX as f64) {
            return Err(bad("must be at least 1 bit/s"));
        }
        Ok(Rate {
            bits_per_s: bits.round() as u64,
        })
    }

    /// Parses a rate that a shaped network can have: 100 Mbit/s to
    /// 100 Gbit/s ([`Rate::any`]'s forms).
    pub fn parse(text: &str) -> Result<Rate> {
        let rate = Rate::any(text)?;
        if !(100_000_000..=100_000_000_000).contains(&rate.bits_per_s) {
            return Err(ExperimentError::Usage(format!(
                "--network {text:?}: give a rate from 100mbit to 100gbit (e.g. 1gbit, 10gbit)"
            )));
        }
        Ok(rate)
    }

    /// The rate as tc writes it (`1000000000bit`).
    fn tc(self) -> String {
        format!("{}bit", self.bits_per_s)
    }

    /// The token bucket's depth: what may leave at once, beyond the rate.
    /// A real NIC has none, so it is small: 0.5 ms of traffic, but at
    /// least 96 KiB, more than a GSO super-packet (64 KiB), which tbf
    /// would otherwise drop. (The qdisc watchdog runs on high-resolution
    /// timers: no need for a timer tick's worth.)
    fn burst_bytes(self) -> u64 {
        (self.bits_per_s / 8 / 2000).max(96 * 1024)
    }

    /// The token bucket's depth and the seconds an idle link takes to
    /// refill it at this rate, for the calibration to time its burst.
    pub(crate) fn bucket(self) -> crate::compare::ShaperBucket {
        let bytes = self.burst_bytes();
        crate::compare::ShaperBucket {
            bytes: bytes as usize,
            refill_s: (8 * bytes) as f64 / self.bits_per_s.max(1) as f64,
        }
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.bits_per_s as f64;
        if b >= 1e9 {
            write!(f, "{} Gbit/s", b / 1e9)
        } else {
            write!(f, "{} Mbit/s", b / 1e6)
        }
    }
}

/// W namespaces joined by shaped links through a bridge; removed on drop.
#[derive(Debug)]
pub struct ShapedNetwork {
    id: String,
    world: usize,
    rate: Rate,
    /// Namespaces made so far (the hub first): what drop removes.
    made: Vec<String>,
}

impl ShapedNetwork {
    /// Makes the namespaces, the bridge and the shaped links of `world`
    /// ranks. Fails at once, saying what is needed, without root, `ip`,
    /// `tc` or tbf; whatever was made before a failure is removed.
    pub fn create(world: usize, rate: Rate) -> Result<ShapedNetwork> {
        if world == 0 || world > MAX_RANKS {
            return Err(ExperimentError::Usage(format!(
                "--network runs 1 to {MAX_RANKS} ranks, not {world}"
            )));
        }
        preflight()?;
        remove_stale();
        let mut net = ShapedNetwork {
            id: format!("{PREFIX}{}", std::process::id()),
            world,
            rate,
            made: Vec::new(),
        };
        // On error the partly built network drops here, and is removed.
        net.build()?;
        Ok(net)
    }

    /// The hub's namespace.
    fn hub(&self) -> String {
        format!("{}h", self.id)
    }

    /// Rank `rank`'s namespace.
    pub fn namespace(&self, rank: usize) -> String {
        format!("{}r{rank}", self.id)
    }

    /// Rank `rank`'s address on the bridge.
    pub fn address(&self, rank: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, (rank + 1).min(254) as u8)
    }

    /// The ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The links' rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    fn build(&mut self) -> Result<()> {
        let hub = self.hub();
        ip(&["netns", "add", &hub])?;
        self.made.push(hub.clone());
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for rank in 0..self.world {
            let ns = self.namespace(rank);
            ip(&["netns", "add", &ns])?;
            self.made.push(ns.clone());
            let port = format!("p{rank}");
            ip(&[
                "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ])?;
            ip(&["-n", &hub, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &hub, "link", "set", &port, "up"])?;
            let address = format!("{}/24", self.address(rank));
            ip(&["-n", &ns, "addr", "add", &address, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            self.shape(&ns, "eth0")?;
            self.shape(&hub, &port)?;
        }
        Ok(())
    }

    /// A token-bucket filter on `device` in `namespace`.
    fn shape(&self, namespace: &str, device: &str) -> Result<()> {
        let rate = self.rate.tc();
        let burst = self.rate.burst_bytes().to_string();
        run_tool(
            Command::new("ip")
                .args(["netns", "exec", namespace, "tc", "qdisc", "add", "dev"])
                .args([
                    device, "root", "tbf", "rate", &rate, "burst", &burst, "latency", "50ms",
                ]),
        )
        .map_err(|e| {
            ExperimentError::Network(format!(
                "{e} (the kernel needs the tbf qdisc: modprobe sch_tbf)"
            ))
        })
    }
}

impl Drop for ShapedNetwork {
    fn drop(&mut self) {
        for ns in self.made.drain(..).rev() {
            remove_namespace(&ns);
        }
    }
}

/// Kills what still runs in `ns`, then removes it (best effort: drop and
/// the stale sweep cannot report).
fn remove_namespace(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let _ = Command::new("ip").args(["netns", "delete", ns]).output();
}

/// Removes the namespaces of runs whose process is gone (killed with
/// SIGKILL, which no handler sees).
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let alive = pid
            .parse::<u32>()
            .is_ok_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            remove_namespace(name);
        }
    }
}

/// Root, `ip`, `tc` and namespaces, checked before anything is made.
fn preflight() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(ExperimentError::Network(
            "shaped networks need root (network namespaces, veth links and tc need \
             CAP_SYS_ADMIN and CAP_NET_ADMIN): run as root, or without --network"
                .into(),
        ));
    }
    for tool in ["ip", "tc"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Err(ExperimentError::Network(format!(
                "`{tool}` is not installed (Debian: apt-get install iproute2)"
            )));
        }
    }
    Ok(())
}

/// `ip args`, its stderr in the error.
fn ip(args: &[&str]) -> Result<()> {
    run_tool(Command::new("ip").args(args)).map_err(|e| {
        if e.contains("Operation not permitted") {
            ExperimentError::Network(format!(
                "{e}: this process lacks CAP_NET_ADMIN / CAP_SYS_ADMIN (a container started \
                 without --cap-add NET_ADMIN, or a user namespace): run where root may make \
                 network namespaces"
            ))
        } else {
            ExperimentError::Network(e)
        }
    })
}

/// Runs a tool; on failure, the command and its stderr.
fn run_tool(command: &mut Command) -> std::result::Result<(), String> {
    let shown = format!(
        "{} {}",
        command.get_program().to_string_lossy(),
        command
            .get_args()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    match command.output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`{shown}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("`{shown}` could not start: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_range_only() {
        assert_eq!(Rate::parse("1gbit").unwrap().bits_per_s, 1_000_000_000);
        assert_eq!(Rate::parse("100Mbit").unwrap().bits_per_s, 100_000_000);
        assert_eq!(Rate::parse("2.5G").unwrap().bits_per_s, 2_500_000_000);
        assert_eq!(Rate::parse("25gbit/s").unwrap().bits_per_s, 25_000_000_000);
        for bad in [
            "10gbps",
            "",
            "fast",
            "1",
            "10mbit",
            "1tbit",
            "gbit",
            "-1gbit",
            "1.2.3gbit",
        ] {
            assert!(
                matches!(Rate::parse(bad), Err(ExperimentError::Usage(_))),
                "{bad}"
            );
        }
        assert_eq!(Rate::parse("1gbit").unwrap().to_string(), "1 Gbit/s");
        assert_eq!(Rate::parse("100mbit").unwrap().to_string(), "100 Mbit/s");
    }

    #[test]
    fn the_bucket_holds_a_tick_and_a_super_packet() {
        assert_eq!(Rate::parse("100mbit").unwrap().burst_bytes(), 96 * 1024);
        assert_eq!(
            Rate::parse("25gbit").unwrap().burst_bytes(),
            25_000_000_000 / 8 / 2000
        );
        // 96 KiB at 100 Mbit/s: 7.9 ms to refill.
        let bucket = Rate::parse("100mbit").unwrap().bucket();
        assert_eq!(bucket.bytes, 96 * 1024);
        assert!((bucket.refill_s - 8.0 * 98_304.0 / 1e8).abs() < 1e-15);
    }
}
