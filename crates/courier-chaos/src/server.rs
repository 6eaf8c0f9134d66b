//! Private server instances on free loopback ports, which the harness may kill (`kill -9` of the
//! whole process group) and restart on the same port and data directory. The shared servers
//! (5432, 3306, 6379, 5672, 4222) are never touched.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::Connection;

/// The kinds of server the harness can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `initdb` + `postgres`, run as the `postgres` OS user.
    Postgres,
    /// `mariadb-install-db` + `mariadbd`.
    Mariadb,
    /// `redis-server --appendonly yes`.
    Redis,
    /// A second RabbitMQ node (`RABBITMQ_NODENAME=chaos-...@localhost`).
    Rabbitmq,
    /// `nats-server -js` with a JetStream store directory of its own.
    Nats,
}

impl Kind {
    /// The binaries this kind needs, with the package that ships them.
    #[must_use]
    pub fn binaries(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Postgres => &[
                (
                    "/usr/local/bin/initdb",
                    "postgresql (link /usr/lib/postgresql/*/bin/initdb there)",
                ),
                (
                    "/usr/local/bin/postgres",
                    "postgresql (link /usr/lib/postgresql/*/bin/postgres there)",
                ),
                ("runuser", "util-linux"),
            ],
            Self::Mariadb => &[
                ("mariadb-install-db", "mariadb-server"),
                ("mariadbd", "mariadb-server"),
            ],
            Self::Redis => &[("redis-server", "redis-server")],
            Self::Rabbitmq => &[("rabbitmq-server", "rabbitmq-server")],
            Self::Nats => &[("nats-server", "nats-server")],
        }
    }
}

/// The binaries of `kind` that cannot be found, each with the package to install.
#[must_use]
pub fn missing_binaries(kind: Kind) -> Vec<String> {
    kind.binaries()
        .iter()
        .filter(|(bin, _)| !found(bin))
        .map(|(bin, package)| format!("`{bin}` (install {package})"))
        .collect()
}

fn found(bin: &str) -> bool {
    if bin.contains('/') {
        return Path::new(bin).exists();
    }
    locate(bin).is_some()
}

/// Where `bin` is on `PATH` or in `/usr/sbin`, `/sbin` (Debian puts `nats-server` there, off an
/// ordinary user's `PATH`).
fn locate(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(bin))
        .find(|candidate| candidate.exists())
}

/// A free TCP port on 127.0.0.1 (bound and released).
///
/// # Errors
/// The bind error.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Sends SIGKILL to a process group (or a process, with a positive id) with `kill(1)`.
pub fn kill9(target: &str) {
    let _ = Command::new("kill")
        .args(["-9", "--", target])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// One private server: started, killed and restarted on the same port and data dir; killed
/// and its directory removed on drop.
#[derive(Debug)]
pub struct Server {
    kind: Kind,
    port: u16,
    dist_port: u16,
    dir: PathBuf,
    node: String,
    child: Option<Child>,
    starts: u32,
    keep: bool,
}

fn os_ids(user: &str) -> anyhow::Result<(u32, u32)> {
    let id = |flag: &str| -> anyhow::Result<u32> {
        let out = Command::new("id").args([flag, user]).output()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .with_context(|| format!("no OS user `{user}`"))
    };
    Ok((id("-u")?, id("-g")?))
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

impl Server {
    /// Creates the data directory under `dir` and starts the server on a free port, waiting
    /// (bounded) until it accepts connections.
    ///
    /// # Errors
    /// A missing binary, a failed initialisation, or a server that did not come up.
    pub async fn start(kind: Kind, dir: &Path) -> anyhow::Result<Self> {
        let missing = missing_binaries(kind);
        if !missing.is_empty() {
            bail!("{kind:?} cannot start: missing {}", missing.join(", "));
        }
        std::fs::create_dir_all(dir)?;
        let mut server = Self {
            kind,
            port: free_port()?,
            dist_port: free_port()?,
            dir: dir.to_owned(),
            node: format!("chaos-{:08x}@localhost", fastrand::u32(..)),
            child: None,
            starts: 0,
            keep: false,
        };
        server.init()?;
        server.spawn()?;
        server.wait_ready(Duration::from_secs(90)).await?;
        if kind == Kind::Mariadb {
            let mut c = sqlx::MySqlConnection::connect(&server.admin_url()).await?;
            sqlx::query("CREATE DATABASE IF NOT EXISTS chaos")
                .execute(&mut c)
                .await?;
        }
        Ok(server)
    }

    /// The kind.
    #[must_use]
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The port clients connect to.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Keeps the data directory on drop (for a failed scenario).
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// The DSN Courier uses (database `postgres`, `chaos`, vhost `/`, or the bare server).
    #[must_use]
    pub fn dsn(&self) -> String {
        let p = self.port;
        match self.kind {
            Kind::Postgres => format!("postgres://postgres@127.0.0.1:{p}/postgres"),
            Kind::Mariadb => format!("mysql://root@127.0.0.1:{p}/chaos"),
            Kind::Redis => format!("redis://127.0.0.1:{p}"),
            Kind::Rabbitmq => format!("amqp://guest:guest@127.0.0.1:{p}/%2f"),
            Kind::Nats => format!("nats://127.0.0.1:{p}"),
        }
    }

    fn admin_url(&self) -> String {
        match self.kind {
            Kind::Mariadb => format!("mysql://root@127.0.0.1:{}/mysql", self.port),
            _ => self.dsn(),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> anyhow::Result<File> {
        Ok(File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))?)
    }

    fn init(&mut self) -> anyhow::Result<()> {
        let data = self.data();
        let status = match self.kind {
            Kind::Postgres => {
                let (uid, gid) = os_ids("postgres")?;
                std::fs::set_permissions(
                    &self.dir,
                    std::os::unix::fs::PermissionsExt::from_mode(0o755),
                )?;
                chown_tree(&self.dir, uid, gid)?;
                Command::new("runuser")
                    .args(["-u", "postgres", "--", "/usr/local/bin/initdb", "-D"])
                    .arg(&data)
                    .args(["-A", "trust", "-U", "postgres", "--no-sync"])
                    .stdout(self.log()?)
                    .stderr(self.log()?)
                    .status()?
            }
            Kind::Mariadb => Command::new("mariadb-install-db")
                .args([
                    "--no-defaults",
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ])
                .arg(format!("--datadir={}", data.display()))
                .stdout(self.log()?)
                .stderr(self.log()?)
                .status()?,
            Kind::Redis | Kind::Nats => {
                std::fs::create_dir_all(&data)?;
                return Ok(());
            }
            Kind::Rabbitmq => {
                std::fs::create_dir_all(&data)?;
                std::fs::write(self.dir.join("enabled_plugins"), "[].\n")?;
                std::fs::write(
                    self.dir.join("rabbitmq.conf"),
                    format!(
                        "listeners.tcp.default = {}\nloopback_users = none\n",
                        self.port
                    ),
                )?;
                let (uid, gid) = os_ids("rabbitmq")?;
                std::fs::set_permissions(
                    &self.dir,
                    std::os::unix::fs::PermissionsExt::from_mode(0o755),
                )?;
                chown_tree(&self.dir, uid, gid)?;
                return Ok(());
            }
        };
        if !status.success() {
            bail!(
                "{:?}: initialising {} failed ({status}); see {}",
                self.kind,
                data.display(),
                self.dir.join("server.log").display()
            );
        }
        Ok(())
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let data = self.data();
        let port = self.port.to_string();
        let mut cmd = match self.kind {
            Kind::Postgres => {
                let (uid, gid) = os_ids("postgres")?;
                let mut c = Command::new("/usr/local/bin/postgres");
                c.arg("-D").arg(&data).args(["-p", &port]);
                c.args([
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=300",
                ]);
                c.arg("-c")
                    .arg(format!("unix_socket_directories={}", self.dir.display()));
                c.uid(uid).gid(gid);
                c
            }
            Kind::Mariadb => {
                let mut c = Command::new("mariadbd");
                c.args([
                    "--no-defaults",
                    "--user=root",
                    "--bind-address=127.0.0.1",
                    "--skip-log-bin",
                ]);
                c.args([
                    "--innodb-flush-log-at-trx-commit=2",
                    "--max-connections=500",
                ]);
                c.arg(format!("--port={port}"));
                c.arg(format!("--datadir={}", data.display()));
                c.arg(format!("--socket={}", self.dir.join("sock").display()));
                c.arg(format!(
                    "--pid-file={}",
                    self.dir.join("mariadb.pid").display()
                ));
                c
            }
            Kind::Redis => {
                let mut c = Command::new("redis-server");
                c.args([
                    "--port",
                    &port,
                    "--bind",
                    "127.0.0.1",
                    "--appendonly",
                    "yes",
                    "--save",
                    "",
                ]);
                c.arg("--dir").arg(&data);
                c
            }
            Kind::Rabbitmq => {
                let mut c = Command::new("rabbitmq-server");
                c.env("RABBITMQ_NODENAME", &self.node)
                    .env("RABBITMQ_NODE_PORT", &port)
                    .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                    .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
                    .env("RABBITMQ_MNESIA_BASE", &data)
                    .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
                    .env("RABBITMQ_PID_FILE", self.dir.join("rabbit.pid"))
                    .env(
                        "RABBITMQ_ENABLED_PLUGINS_FILE",
                        self.dir.join("enabled_plugins"),
                    )
                    .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq.conf"));
                c
            }
            Kind::Nats => {
                // A server name of its own: JetStream keeps its store under it.
                let mut c =
                    Command::new(locate("nats-server").unwrap_or_else(|| "nats-server".into()));
                c.args(["-a", "127.0.0.1", "-p", &port, "-js", "-n", "chaos"]);
                c.arg("-sd").arg(&data);
                c
            }
        };
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(self.log()?)
            .stderr(self.log()?);
        self.child = Some(
            cmd.spawn()
                .with_context(|| format!("starting {:?}", self.kind))?,
        );
        self.starts += 1;
        Ok(())
    }

    /// Whether the server answers a real client (a query, `PING`, an AMQP handshake).
    pub async fn ready(&self) -> bool {
        let attempt = async {
            match self.kind {
                Kind::Postgres => sqlx::PgConnection::connect(&self.dsn()).await.is_ok(),
                Kind::Mariadb => sqlx::MySqlConnection::connect(&self.admin_url())
                    .await
                    .is_ok(),
                Kind::Redis => {
                    let Ok(client) = redis::Client::open(self.dsn()) else {
                        return false;
                    };
                    match client.get_multiplexed_async_connection().await {
                        Ok(mut c) => redis::cmd("PING")
                            .query_async::<String>(&mut c)
                            .await
                            .is_ok(),
                        Err(_) => false,
                    }
                }
                Kind::Nats => {
                    // Accepting connections is not enough: JetStream must have recovered its
                    // store and answer its API.
                    // (`$JS.API.INFO` answered; async-nats's typed account info does not parse
                    // nats-server 2.9's answer).
                    match async_nats::connect(format!("127.0.0.1:{}", self.port)).await {
                        Ok(client) => client
                            .request("$JS.API.INFO", "".into())
                            .await
                            .is_ok_and(|reply| !reply.payload.is_empty()),
                        Err(_) => false,
                    }
                }
                Kind::Rabbitmq => {
                    match lapin::Connection::connect(
                        &self.dsn(),
                        lapin::ConnectionProperties::default(),
                    )
                    .await
                    {
                        Ok(c) => {
                            let _ = c.close(200, "ready".into()).await;
                            true
                        }
                        Err(_) => false,
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(3), attempt)
            .await
            .unwrap_or(false)
    }

    /// Waits until [`Server::ready`], at most `limit`.
    ///
    /// # Errors
    /// The server did not come up in time, or its process exited.
    pub async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if self.ready().await {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
                && self.kind != Kind::Rabbitmq
            {
                bail!(
                    "{:?} exited at start ({status}); see {}",
                    self.kind,
                    self.dir.join("server.log").display()
                );
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "{:?} on port {} did not accept connections within {limit:?}; see {}",
                    self.kind,
                    self.port,
                    self.dir.join("server.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `kill -9` of the server's whole process group, and for RabbitMQ, whose node runs under
    /// `su`, of the pid the node wrote (its helper processes exit with it).
    pub fn kill(&mut self) {
        if self.kind == Kind::Rabbitmq
            && let Ok(pid) = std::fs::read_to_string(self.dir.join("rabbit.pid"))
        {
            kill9(pid.trim());
        }
        if let Some(mut child) = self.child.take() {
            kill9(&format!("-{}", child.id()));
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restarts on the same port and data directory and waits until it accepts connections.
    ///
    /// # Errors
    /// As [`Server::start`].
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()?;
        self.wait_ready(Duration::from_secs(90)).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
