//! Volume mode: a sandbox on an engine that does not see this host's files
//! (a remote `DOCKER_HOST`, a cluster).  Nothing of the host is bind-mounted;
//! everything travels through the engine contract (`create_volume`,
//! `copy_in`, `copy_out`, `exec_io`), so any engine that implements it can
//! hold such a sandbox.
//!
//! | inside        | local mode (bind of a host path)  | volume mode (engine volume)             |
//! |---------------|-----------------------------------|-----------------------------------------|
//! | `/work`       | the workspace disk image          | `lw-sb-ROOTID-NAME-work`                |
//! | `/lw/mailbox` | `ROOT/sandboxes/NAME`             | `lw-sb-ROOTID-NAME-mail` (the courier carries it, courier.rs) |
//! | `/lw/mirror`  | the mirror, read-only             | none: the clone comes from a bundle     |
//! | tools         | `/usr/local/bin/lw-{post,inbox,mcp}` | `/lw/bin` (`lw-sb-ROOTID-tools-KEY`, read-only, first on `PATH`) |
//! | `/lw/registry`| `ROOT/registry`, read-only        | `/lw/mailbox/registry`, a copy made at create |
//!
//! The volumes are filled before the sandbox starts, through a short-lived
//! helper container of the sandbox's own image (no network, labelled like
//! the sandbox so `gc` finds it when a create dies): as root it gives
//! `/work` and `/lw/mailbox` to the sandbox's user; where the engine runs
//! nothing as root (Kubernetes) it runs as that user, the pod's `fsGroup`
//! having made the volumes its, and checks it can write them.  It receives
//! the mail dir's Maildirs,
//! the tools (once per root and version: a marker file says the volume is
//! complete) and a git bundle of the mirror, and says the image's `PATH`.
//! The clone is then made inside the sandbox from the bundle, as its user,
//! on its branch, exactly as local mode makes it from the mirror; the
//! bundle is removed after, so `origin`'s refs move only when `push`
//! moves them (a fetch from a stale bundle would move them back).
//!
//! `push` needs nothing new: it already reaches the sandbox's repository
//! only through `exec` (git's `ext::` transport, push.rs).
//!
//! Published ports are bound on the engine's host, on all its addresses
//! (this host reaches them there), at ports leased against what the
//! engine's loopwright containers publish, not against this host's
//! listeners ([`lease_ports`]).
//!
//! The egress proxy is carried on Kubernetes (its allow-list travels in its
//! environment, its address is a Service: crates/wall/src/egress/); on a remote Docker
//! engine it is refused (69), as no test covers it there yet.
//!
//! Not in volume mode (refused, 69): the agent kits (they bind-mount host
//! files), shared services, gVisor
//! (its scratch tmpfs is the host's), and the disk quotas (a volume takes
//! what the engine's disk has).

use std::io::Read;
use std::path::{Path, PathBuf};

use super::{CreateOptions, LABEL_ROOT, LABEL_SANDBOX, MAILBOX, Network, Record, Sandboxes, WORK};
use base::error::{Error, Exit, Result};
use engine::{ContainerSpec, ExecIo, ExecRequest, OutStream, VolumeMount};

/// Where the tools are inside a volume-mode sandbox (first on its `PATH`).
pub const TOOLS_DIR: &str = "/lw/bin";
/// Where the registry's copy is inside a volume-mode sandbox.
pub const REGISTRY_COPY: &str = "/lw/mailbox/registry";
/// The bundle the clone is made from, inside the workspace.
pub const BUNDLE: &str = "/work/.lw/origin.bundle";

/// Whether sandboxes on `engine` bind-mount host paths or live in volumes.
pub fn volume_mode(sb: &Sandboxes) -> Result<bool> {
    Ok(engine::hostpaths::cached(sb.engine, &sb.root)? == engine::hostpaths::Sharing::Separate)
}

/// Refuses (69) what volume mode cannot carry yet, before anything is made;
/// `cluster`: the engine is Kubernetes, which carries the egress proxy.
pub fn check(opts: &CreateOptions, address: &str, cluster: bool) -> Result<()> {
    let no = |what: &str, why: &str| {
        Err(Error::new(
            Exit::Unavailable,
            format!(
                "{what} is not available on the engine at {address}, which does not see this host's files (volume mode): {why}"
            ),
        ))
    };
    if opts.network == Network::Egress && !cluster {
        return no(
            "--network egress",
            "the egress proxy is carried only on Kubernetes so far; use --network none or bridge, or a cluster",
        );
    }
    if opts.agent.is_some() {
        return no(
            "--agent",
            "the agent kits' model proxy mounts files from this host",
        );
    }
    if !opts.services.is_empty() {
        return no(
            "--service",
            "shared services are declared and kept on this host",
        );
    }
    Ok(())
}

impl<'a> Sandboxes<'a> {
    /// The mail volume of sandbox `name` (its workspace volume is `volume_name`).
    pub fn mail_volume(&self, name: &str) -> String {
        format!("lw-sb-{}-{name}-mail", self.id)
    }

    pub(super) fn labels_for(
        &self,
        name: Option<&str>,
    ) -> std::collections::BTreeMap<String, String> {
        let mut l = std::collections::BTreeMap::from([
            (LABEL_ROOT.to_string(), self.id.clone()),
            (
                super::LABEL_ROOT_PATH.to_string(),
                self.root.dir.to_string_lossy().into_owned(),
            ),
        ]);
        if let Some(n) = name {
            l.insert(LABEL_SANDBOX.to_string(), n.to_string());
        }
        l
    }

    /// Makes and fills the volumes of `rec` (module documentation) and
    /// turns `spec` (made for local mode) into its volume-mode form.
    pub(super) fn volume_prepare(
        &self,
        rec: &Record,
        spec: &mut ContainerSpec,
        bins: &[(PathBuf, &str)],
    ) -> Result<()> {
        let key = tools_key(bins);
        let tools = self.tools_volume(&key);
        let mounts = self.make_volumes(rec, &tools)?;
        let helper = format!("{}-setup", rec.container);
        // As root where the engine allows it, to give the volumes to the
        // sandbox's user; as that user where it does not (Kubernetes: the
        // pod's fsGroup makes them its), the chown then left out.
        let root = self.engine.runs_as_root();
        let as_user = helper_user(root, rec.uid);
        let mut h = ContainerSpec {
            name: Some(helper.clone()),
            image: rec.image.clone(),
            entrypoint: Some(vec![
                "/bin/sh".into(),
                "-c".into(),
                super::spec::KEEPALIVE.into(),
            ]),
            user: Some(as_user.clone()),
            labels: spec.labels.clone(),
            network: Some("none".into()),
            volumes: mounts.clone(),
            runtime: spec.runtime.clone(),
            ..Default::default()
        };
        h.volumes.push(VolumeMount {
            volume: tools.clone(),
            target: TOOLS_DIR.into(),
            read_only: false,
        });
        // A helper left by a killed create is this create's to replace.
        self.engine.remove(&helper, true)?;
        self.engine.create(&h)?;
        let res = self
            .engine
            .start(&helper)
            .and_then(|()| self.fill_volumes(rec, &helper, root, &key, bins));
        let removed = self.engine.remove(&helper, true);
        let path = res?;
        removed?;
        on_volumes(spec, mounts, &tools, &path);
        Ok(())
    }

    /// The root's volume of the tools whose build is `key`.
    pub(super) fn tools_volume(&self, key: &str) -> String {
        format!("lw-sb-{}-tools-{key}", self.id)
    }

    /// Makes the workspace, mail and `tools` volumes of `rec`; the mounts
    /// of the first two.
    fn make_volumes(&self, rec: &Record, tools: &str) -> Result<Vec<VolumeMount>> {
        let name = rec.name.as_str();
        let mail = rec
            .mail_volume
            .clone()
            .unwrap_or_else(|| self.mail_volume(name));
        self.engine
            .create_volume(&rec.volume, &self.labels_for(Some(name)))?;
        self.engine
            .create_volume(&mail, &self.labels_for(Some(name)))?;
        self.engine.create_volume(tools, &self.labels_for(None))?;
        Ok(mounts(&rec.volume, &mail))
    }

    /// In the started `helper`: gives the volumes to the sandbox's user
    /// (as `root`) or checks that user may write them, then copies in the
    /// mailbox skeleton and, unless the tools volume of `key` holds them,
    /// the tools.  The image's PATH.
    fn fill_volumes(
        &self,
        rec: &Record,
        helper: &str,
        root: bool,
        key: &str,
        bins: &[(PathBuf, &str)],
    ) -> Result<String> {
        let name = rec.name.as_str();
        let uid = rec.uid;
        // `home` keeps the workspace volume from being empty when the
        // sandbox's container first mounts it: an engine copies the image's
        // directory (and its owner) into an empty volume.
        let own = if root {
            format!(
                "mkdir -p {WORK}/home && chown {uid}:{uid} {WORK} {WORK}/home {MAILBOX} && chmod 0755 {WORK} && chmod 0700 {MAILBOX} && "
            )
        } else {
            format!(
                "for d in {WORK} {MAILBOX} {TOOLS_DIR}; do [ -w \"$d\" ] || {{ echo \"$d is not writable by uid $(id -u): the engine's storage does not give it to the pod's fsGroup\" >&2; exit 1; }}; done && mkdir -p {WORK}/home && "
            )
        };
        let script = format!(
            "{own}\
             printf 'PATH=%s\\n' \"$PATH\" && if [ -e {TOOLS_DIR}/.complete-{key} ]; then echo tools; fi"
        );
        let (code, out, err) = self.exec_capture(helper, &helper_user(root, uid), &script)?;
        if code != 0 {
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "cannot prepare the volumes of sandbox '{name}' (exit {code}): {}",
                    base::visible::visible(err.trim())
                ),
            ));
        }
        let path = image_path(&out);
        let have_tools = out.lines().any(|l| l == "tools");
        self.engine
            .copy_in(helper, MAILBOX, Box::new(mail_skeleton(self, uid)?))?;
        if !have_tools {
            self.engine
                .copy_in(helper, TOOLS_DIR, tools_tar(bins, key)?)?;
        }
        Ok(path)
    }

    /// Puts a bundle of the mirror at [`BUNDLE`] in the (started) sandbox,
    /// for the clone to be made from.
    pub(super) fn volume_bundle(&self, rec: &Record, mirror: &Path) -> Result<()> {
        let t = self.volume_bundle_tar(rec, mirror)?;
        self.engine.copy_in(&rec.container, WORK, t)
    }

    /// A tar of a bundle of the mirror, to unpack at [`WORK`]: it holds
    /// [`BUNDLE`].  Read from a file already unlinked.
    pub(super) fn volume_bundle_tar(
        &self,
        rec: &Record,
        mirror: &Path,
    ) -> Result<Box<dyn Read + Send>> {
        let dir = self.root.state_dir().join("bundle");
        let file = dir.join(format!(
            "{}.{:016x}.bundle",
            rec.name,
            base::id::random128() as u64
        ));
        let res = make_bundle(mirror, &file).and_then(|()| bundle_tar(&file, rec.uid));
        let _ = std::fs::remove_file(&file);
        res
    }

    /// Runs a shell script in `container` as `user`: status, stdout, stderr.
    pub(super) fn exec_capture(
        &self,
        container: &str,
        user: &str,
        script: &str,
    ) -> Result<(i64, String, String)> {
        self.exec_args(container, user, script, &[])
    }

    /// Runs `script` with `args` as its `$1`... in `container` as `user`.
    pub(super) fn exec_args(
        &self,
        container: &str,
        user: &str,
        script: &str,
        args: &[String],
    ) -> Result<(i64, String, String)> {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let mut cmd = vec![
            "/bin/sh".to_string(),
            "-c".into(),
            script.into(),
            "lw".into(),
        ];
        cmd.extend(args.iter().cloned());
        let req = ExecRequest {
            cmd,
            env: vec![],
            user: Some(user.into()),
            workdir: Some("/".into()),
        };
        let mut on = |s: OutStream, b: &[u8]| match s {
            OutStream::Stdout => out.extend_from_slice(b),
            OutStream::Stderr => err.extend_from_slice(b),
        };
        let code = self
            .engine
            .exec_io(container, &req, ExecIo::output(&mut on))?;
        Ok((
            code,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        ))
    }
}

/// The image's `PATH` from a setup script's `PATH=...` line (Debian's
/// default when it printed none).
pub(super) fn image_path(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("PATH="))
        .filter(|p| !p.is_empty())
        .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .to_string()
}

/// The mounts of a workspace volume `work` and a mail volume `mail`.
pub(super) fn mounts(work: &str, mail: &str) -> Vec<VolumeMount> {
    vec![
        VolumeMount {
            volume: work.to_string(),
            target: WORK.into(),
            read_only: false,
        },
        VolumeMount {
            volume: mail.to_string(),
            target: MAILBOX.into(),
            read_only: false,
        },
    ]
}

/// Turns `spec` (made for local mode) into its volume-mode form: no bind,
/// the workspace and mail `mounts` and the `tools` volume read-only, the
/// registry's copy, the tools first on the image's `path`.
pub(super) fn on_volumes(
    spec: &mut ContainerSpec,
    mounts: Vec<VolumeMount>,
    tools: &str,
    path: &str,
) {
    spec.binds.clear();
    spec.volumes = mounts;
    spec.volumes.push(VolumeMount {
        volume: tools.to_string(),
        target: TOOLS_DIR.into(),
        read_only: true,
    });
    spec.env
        .retain(|e| !e.starts_with("LW_REGISTRY=") && !e.starts_with("PATH="));
    spec.env.push(format!("LW_REGISTRY={REGISTRY_COPY}"));
    spec.env.push(format!("PATH={TOOLS_DIR}:{path}"));
}

/// Makes a bundle of every ref of the mirror (and its HEAD) at `to`.
pub fn make_bundle(mirror: &Path, to: &Path) -> Result<()> {
    if let Some(d) = to.parent() {
        std::fs::create_dir_all(d).map_err(|e| Error::io("cannot create", d, e))?;
    }
    let out = repo::git::output(
        repo::git::command(None)
            .arg("--git-dir")
            .arg(mirror)
            .args(["bundle", "create", "--quiet"])
            .arg(to)
            .args(["--all", "HEAD"]),
        "bundle the mirror",
    )?;
    if !out.status.success() {
        return Err(Error::new(
            Exit::Unavailable,
            format!(
                "cannot bundle the mirror '{}' for a sandbox on a remote engine: {}",
                mirror.display(),
                base::visible::visible(String::from_utf8_lossy(&out.stderr).trim())
            ),
        ));
    }
    Ok(())
}

/// Which build of the tools `bins` are: their names, sizes and mtimes.
/// The user the setup helper runs as: root where the engine allows it,
/// else the sandbox's own.
fn helper_user(root: bool, uid: u32) -> String {
    if root {
        "0:0".to_string()
    } else {
        format!("{uid}:{uid}")
    }
}

pub(super) fn tools_key(bins: &[(PathBuf, &str)]) -> String {
    let mut s = String::new();
    for (p, n) in bins {
        let m = std::fs::metadata(p).ok();
        let mt = m
            .as_ref()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        s += &format!("{n} {} {mt}\n", m.map_or(0, |m| m.len()));
    }
    base::digest::sha256_hex(s.as_bytes())[..16].to_string()
}

fn header(path: &str, kind: tar::EntryType, size: u64, mode: u32, uid: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(uid.into());
    h.set_gid(uid.into());
    h.set_mtime(base::time::now().as_secs());
    h.set_path(path)
        .expect("a short relative path fits a tar header");
    h.set_cksum();
    h
}

/// A tar of directories and small files, built in memory.
pub(super) struct TarBuf(tar::Builder<Vec<u8>>);

impl TarBuf {
    pub(super) fn new() -> TarBuf {
        TarBuf(tar::Builder::new(Vec::new()))
    }
    pub(super) fn dir(&mut self, path: &str, mode: u32, uid: u32) {
        let h = header(path, tar::EntryType::Directory, 0, mode, uid);
        self.0
            .append(&h, std::io::empty())
            .expect("writing to memory does not fail");
    }
    pub(super) fn file(&mut self, path: &str, data: &[u8], mode: u32, uid: u32) {
        let h = header(path, tar::EntryType::Regular, data.len() as u64, mode, uid);
        self.0
            .append(&h, data)
            .expect("writing to memory does not fail");
    }
    pub(super) fn finish(self) -> std::io::Cursor<Vec<u8>> {
        std::io::Cursor::new(
            self.0
                .into_inner()
                .expect("writing to memory does not fail"),
        )
    }
}

/// The mail dir's Maildirs and the registry's copy, owned by `uid`.
pub(super) fn mail_skeleton(sb: &Sandboxes, uid: u32) -> Result<std::io::Cursor<Vec<u8>>> {
    let mut t = TarBuf::new();
    for b in ["outbox", "inbox"] {
        t.dir(b, 0o700, uid);
        for s in ["tmp", "new", "cur"] {
            t.dir(&format!("{b}/{s}"), 0o700, uid);
        }
    }
    t.dir("registry", 0o755, uid);
    if let Ok(rd) = std::fs::read_dir(sb.root.registry_dir()) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with('.') || !n.ends_with(".json") {
                continue;
            }
            if let Ok(b) = std::fs::read(e.path()) {
                t.file(&format!("registry/{n}"), &b, 0o644, uid);
            }
        }
    }
    Ok(t.finish())
}

/// A tar holding `.lw/origin.bundle` (the file at `bundle`), streamed.
fn bundle_tar(bundle: &Path, uid: u32) -> Result<Box<dyn Read + Send>> {
    let f = std::fs::File::open(bundle).map_err(|e| Error::io("cannot open", bundle, e))?;
    let size = f
        .metadata()
        .map_err(|e| Error::io("cannot stat", bundle, e))?
        .len();
    let mut head = Vec::new();
    head.extend_from_slice(header(".lw", tar::EntryType::Directory, 0, 0o700, uid).as_bytes());
    head.extend_from_slice(
        header(
            ".lw/origin.bundle",
            tar::EntryType::Regular,
            size,
            0o600,
            uid,
        )
        .as_bytes(),
    );
    let pad = (512 - (size % 512) as usize) % 512;
    let tail = vec![0u8; pad + 1024];
    Ok(Box::new(
        std::io::Cursor::new(head)
            .chain(f.take(size))
            .chain(std::io::Cursor::new(tail)),
    ))
}

/// The tools, owned by root, then the marker that says they are complete.
fn tools_tar(bins: &[(PathBuf, &str)], key: &str) -> Result<Box<dyn Read + Send>> {
    let mut t = TarBuf::new();
    for (p, n) in bins {
        let b = std::fs::read(p).map_err(|e| Error::io("cannot read", p, e))?;
        t.file(n, &b, 0o755, 0);
    }
    t.file(&format!(".complete-{key}"), b"", 0o644, 0);
    Ok(Box::new(t.finish()))
}

/// Leases host ports for `whats` on the engine's host: a port is free when
/// no lease of this root holds it and no container of any loopwright root
/// on that engine publishes it now (something else listening there is
/// found when the engine refuses to publish it, at start).  Also returns
/// the engine's host, where the ports are reached.
pub fn lease_ports(
    sb: &Sandboxes,
    range: wall::ports::Range,
    owner: &str,
    whats: &[String],
) -> Result<(Vec<u16>, Option<String>)> {
    if whats.is_empty() {
        return Ok((vec![], None));
    }
    let address = sb.engine.address();
    let published: std::collections::HashSet<u16> = sb
        .engine
        .containers_with_label(LABEL_ROOT)?
        .iter()
        .flat_map(|c| c.ports.iter().map(|p| p.host_port))
        .collect();
    let place = format!("the engine's host ({address})");
    let got = sb
        .leases()
        .lease_where(range, owner, whats, &|p| published.contains(&p), &place)?;
    Ok((got, Some(engine_host(&address))))
}

/// The host of an engine address: `tcp://HOST:PORT` and `ssh://USER@HOST`
/// give HOST (an IPv6 address keeps its brackets).
fn engine_host(address: &str) -> String {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let rest = rest.split('/').next().unwrap_or(rest);
    match rest.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) && !h.is_empty() => h.to_string(),
        _ => rest.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_is_refused_in_volume_mode_only_off_kubernetes() {
        let opts = CreateOptions {
            name: "a".into(),
            branch: "a".into(),
            from: None,
            scope: vec![],
            ports: vec![],
            secrets: vec![],
            network: Network::Egress,
            allow: vec![],
            image: None,
            allow_stale: false,
            no_fetch: false,
            agent: None,
            limits: Default::default(),
            allow_install_change: false,
            services: vec![],
            runtime: None,
        };
        check(&opts, "tcp://b:2376", true).expect("a cluster carries the proxy");
        let e = check(&opts, "tcp://b:2376", false).unwrap_err();
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(
            e.msg
                .starts_with("--network egress is not available on the engine at tcp://b:2376"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn the_engine_host_of_an_address() {
        for (a, h) in [
            ("tcp://172.18.0.2:2376", "172.18.0.2"),
            ("tcp://build.example:2376", "build.example"),
            ("ssh://me@build.example", "build.example"),
            ("ssh://me@build.example:2222", "build.example"),
            ("tcp://[fd00::2]:2376", "[fd00::2]"),
        ] {
            assert_eq!(engine_host(a), h, "{a}");
        }
    }

    #[test]
    fn the_bundle_tar_is_a_tar_of_the_file() {
        let dir = std::env::temp_dir().join(format!("lw-vol-{}", base::id::new_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("b");
        std::fs::write(&f, b"0123456789").unwrap();
        let mut r = bundle_tar(&f, 100_000).unwrap();
        let mut bytes = Vec::new();
        r.read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes.len() % 512, 0);
        let mut a = tar::Archive::new(&bytes[..]);
        let mut seen = vec![];
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            seen.push((
                e.path().unwrap().to_string_lossy().into_owned(),
                e.header().uid().unwrap(),
                data,
            ));
        }
        assert_eq!(
            seen,
            vec![
                (".lw".to_string(), 100_000, vec![]),
                (
                    ".lw/origin.bundle".to_string(),
                    100_000,
                    b"0123456789".to_vec()
                )
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
