//! Network-namespace hosts made by `scripts/hosts` (one bridge, a veth per host, private servers
//! bound to the bridge address), held by a guard that takes them down on drop, and the CPU time
//! of processes read from `/proc`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// The servers `scripts/hosts up --servers` can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// A private PostgreSQL cluster.
    Postgres,
    /// A private Redis server.
    Redis,
    /// A second RabbitMQ node.
    Rabbitmq,
}

impl ServerKind {
    /// The name `--servers` takes.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Redis => "redis",
            Self::Rabbitmq => "rabbitmq",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::Postgres => "POSTGRES",
            Self::Redis => "REDIS",
            Self::Rabbitmq => "AMQP",
        }
    }
}

/// The `scripts/hosts` of this repository.
#[must_use]
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/hosts")
}

/// Why hosts cannot be made here, or `None` when they can (root, `ip` found).
#[must_use]
pub fn unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)".into());
    }
    let ip = Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match ip {
        Ok(s) if s.success() => None,
        _ => Some("`ip` (iproute2) is missing".into()),
    }
}

/// Hosts that are up; [`Drop`] runs `scripts/hosts down` for their prefix.
#[derive(Debug)]
pub struct Hosts {
    script: PathBuf,
    prefix: String,
    net: String,
    env: HashMap<String, String>,
    names: Vec<String>,
    links: Vec<String>,
}

fn words(env: &HashMap<String, String>, key: &str) -> Vec<String> {
    env.get(key)
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

impl Hosts {
    /// `scripts/hosts up n --servers servers` with the namespace prefix `prefix` (1-5 letters) on
    /// `net.0/24` (e.g. `10.231.78`). Idempotent like the script.
    ///
    /// # Errors
    /// The script failed (its message says why: not root, no namespaces, a server that did not
    /// start).
    pub fn up(prefix: &str, net: &str, n: usize, servers: &[ServerKind]) -> anyhow::Result<Self> {
        let script = script();
        let list = if servers.is_empty() {
            "none".to_owned()
        } else {
            servers
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>()
                .join(",")
        };
        let out = Command::new(&script)
            .args(["up", &n.to_string(), "--servers", &list])
            .env("COURIER_HOSTS_PREFIX", prefix)
            .env("COURIER_HOSTS_NET", net)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        let mut hosts = Self {
            script,
            prefix: prefix.to_owned(),
            net: net.to_owned(),
            env: HashMap::new(),
            names: Vec::new(),
            links: Vec::new(),
        };
        if !out.status.success() {
            bail!(
                "scripts/hosts up {n} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((k, v)) = line.split_once('=') {
                hosts
                    .env
                    .insert(k.to_owned(), v.trim_matches('\'').to_owned());
            }
        }
        hosts.names = words(&hosts.env, "COURIER_HOSTS_NAMES");
        hosts.links = words(&hosts.env, "COURIER_HOSTS_LINKS");
        if hosts.names.len() != n || hosts.links.len() != n {
            bail!("scripts/hosts up {n} printed {} host(s)", hosts.names.len());
        }
        Ok(hosts)
    }

    /// How many hosts.
    #[must_use]
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Host `i`'s namespace name (0-based).
    ///
    /// # Panics
    /// When `i` is not below [`Hosts::len`] (as for [`Hosts::command`], [`Hosts::cut`] and
    /// [`Hosts::restore`]).
    #[must_use]
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The DSN of a server that `up` started.
    #[must_use]
    pub fn url(&self, kind: ServerKind) -> Option<&str> {
        self.env
            .get(&format!("COURIER_HOSTS_{}_URL", kind.key()))
            .map(String::as_str)
    }

    /// The pid `scripts/hosts` started a server as (the root of its process tree).
    #[must_use]
    pub fn server_pid(&self, kind: ServerKind) -> Option<u32> {
        self.env
            .get(&format!("COURIER_HOSTS_{}_PID", kind.key()))?
            .parse()
            .ok()
    }

    /// `program` to run on host `i`: `ip netns exec <host> program`.
    #[must_use]
    pub fn command(&self, i: usize, program: &Path) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("ip");
        c.args(["netns", "exec", &self.names[i]]).arg(program);
        c
    }

    fn link(&self, i: usize, state: &str) -> anyhow::Result<()> {
        let status = Command::new("ip")
            .args(["link", "set", &self.links[i], state])
            .status()?;
        if !status.success() {
            bail!("ip link set {} {state}: {status}", self.links[i]);
        }
        Ok(())
    }

    /// Cuts host `i` off the bridge (`ip link set <its veth> down`): its packets are dropped,
    /// its open connections hang until the link comes back.
    ///
    /// # Errors
    /// `ip` failed.
    pub fn cut(&self, i: usize) -> anyhow::Result<()> {
        self.link(i, "down")
    }

    /// Puts host `i` back on the bridge.
    ///
    /// # Errors
    /// `ip` failed.
    pub fn restore(&self, i: usize) -> anyhow::Result<()> {
        self.link(i, "up")
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .arg("down")
            .env("COURIER_HOSTS_PREFIX", &self.prefix)
            .env("COURIER_HOSTS_NET", &self.net)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
    }
}

fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// `(ppid, utime + stime, cutime + cstime)` in clock ticks from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(u32, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    let ppid = u32::try_from(n(1)?).ok()?;
    Some((ppid, n(11)? + n(12)?, n(13)? + n(14)?))
}

/// CPU time (user + system) a process has used so far.
#[must_use]
pub fn cpu_of(pid: u32) -> Duration {
    stat(pid).map_or(Duration::ZERO, |(_, own, _)| ticks(own))
}

fn ticks(n: u64) -> Duration {
    Duration::from_micros(n * 1_000_000 / clock_ticks())
}

/// CPU time used by `root` and every process below it, including children that exited and were
/// waited for (a PostgreSQL backend's time moves to the postmaster when it ends).
#[must_use]
pub fn cpu_of_tree(root: u32) -> Duration {
    let mut parents: HashMap<u32, (u32, u64)> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            if let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok())
                && let Some((ppid, own, children)) = stat(pid)
            {
                parents.insert(pid, (ppid, own + children));
            }
        }
    }
    let below = |mut pid: u32| {
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match parents.get(&pid) {
                Some((ppid, _)) if *ppid != 0 => pid = *ppid,
                _ => return false,
            }
        }
        false
    };
    ticks(
        parents
            .iter()
            .filter(|(pid, _)| below(**pid))
            .map(|(_, (_, t))| *t)
            .sum(),
    )
}
