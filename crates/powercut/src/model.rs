//! The file system as two trees: what processes see now (`live`) and what a
//! power cut would leave (`durable`).
//!
//! The durability rules are the ones ext4 and POSIX promise, no more:
//! a file's data and mode become durable by an fsync (or fdatasync) of that
//! file; a name (created, renamed, linked or unlinked) becomes durable by an
//! fsync of the directory holding it.  Nothing else makes anything durable:
//! not close, not rename, not a parent directory's fsync.  A cut replaces
//! `live` with what `durable` says: the tree reachable from the root through
//! durable names, each file with its durable data (empty if it was never
//! fsynced, as ext4 would leave an inode whose name reached the journal
//! before its data), each directory with its durable entries (empty if it
//! was never fsynced).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::SystemTime;

/// The root directory's inode number (FUSE's).
pub const ROOT: u64 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// One inode.  `data` for files, `entries` for directories, `target` for
/// symbolic links (whose target is fixed at creation, so durable with the
/// inode).
#[derive(Clone, Debug)]
pub struct Node {
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub mtime: SystemTime,
    pub data: Vec<u8>,
    pub entries: BTreeMap<OsString, u64>,
    pub target: PathBuf,
}

impl Node {
    pub fn new(kind: Kind, mode: u32, uid: u32, gid: u32) -> Node {
        Node {
            kind,
            mode: mode & 0o7777,
            uid,
            gid,
            nlink: 1,
            mtime: SystemTime::now(),
            data: Vec::new(),
            entries: BTreeMap::new(),
            target: PathBuf::new(),
        }
    }
}

/// An operation's failure, as an errno.
pub type Res<T> = Result<T, i32>;

/// Both trees, the count of durability points and the armed cut.
#[derive(Debug)]
pub struct Model {
    pub live: HashMap<u64, Node>,
    durable: HashMap<u64, Node>,
    next: u64,
    /// Durability points (fsync of a file or a directory) seen so far.
    pub syncs: u64,
    /// Cut right after this durability point (1-based) took effect.
    pub armed: Option<u64>,
    /// The power is off: every operation fails with EIO until [`Model::restore`].
    pub dead: bool,
    /// The durability point a cut happened at (0: a cut outside any sync).
    pub cut_at: Option<u64>,
    /// Answer RENAME_NOREPLACE with EINVAL, as gVisor's file system does, so
    /// that writers take their link+unlink path.
    pub refuse_noreplace: bool,
    /// link(2) calls served (the writers' fallback when NOREPLACE is refused).
    pub links: u64,
}

impl Default for Model {
    fn default() -> Self {
        let mut live = HashMap::new();
        live.insert(ROOT, Node::new(Kind::Dir, 0o755, 0, 0));
        let durable = live.clone();
        Model {
            live,
            durable,
            next: ROOT + 1,
            syncs: 0,
            armed: None,
            dead: false,
            cut_at: None,
            refuse_noreplace: false,
            links: 0,
        }
    }
}

const EIO: i32 = libc::EIO;

impl Model {
    fn alive(&self) -> Res<()> {
        if self.dead { Err(EIO) } else { Ok(()) }
    }

    pub fn node(&self, ino: u64) -> Res<&Node> {
        self.alive()?;
        self.live.get(&ino).ok_or(libc::ENOENT)
    }

    pub fn node_mut(&mut self, ino: u64) -> Res<&mut Node> {
        self.alive()?;
        self.live.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn dir(&self, ino: u64) -> Res<&Node> {
        let n = self.node(ino)?;
        if n.kind == Kind::Dir {
            Ok(n)
        } else {
            Err(libc::ENOTDIR)
        }
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Res<u64> {
        self.dir(parent)?
            .entries
            .get(name)
            .copied()
            .ok_or(libc::ENOENT)
    }

    /// Creates `name` in `parent` as a new inode made from `node`.
    pub fn create(&mut self, parent: u64, name: &OsStr, node: Node) -> Res<u64> {
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next;
        self.next += 1;
        if node.kind == Kind::Symlink {
            // A symbolic link's target is written with its inode.
            self.durable.insert(ino, node.clone());
        }
        self.live.insert(ino, node);
        self.touch_dir(parent, name, Some(ino));
        Ok(ino)
    }

    fn touch_dir(&mut self, parent: u64, name: &OsStr, to: Option<u64>) {
        let d = self.live.get_mut(&parent).expect("checked by the caller");
        d.mtime = SystemTime::now();
        match to {
            Some(ino) => d.entries.insert(name.to_owned(), ino),
            None => d.entries.remove(name),
        };
    }

    pub fn link(&mut self, ino: u64, parent: u64, name: &OsStr) -> Res<()> {
        if self.node(ino)?.kind == Kind::Dir {
            return Err(libc::EPERM);
        }
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(libc::EEXIST);
        }
        self.node_mut(ino)?.nlink += 1;
        self.links += 1;
        self.touch_dir(parent, name, Some(ino));
        Ok(())
    }

    /// unlink(2) (`dir` false) or rmdir(2) (`dir` true).
    pub fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Res<()> {
        let ino = self.lookup(parent, name)?;
        let n = self.node(ino)?;
        match (dir, n.kind == Kind::Dir) {
            (true, false) => return Err(libc::ENOTDIR),
            (false, true) => return Err(libc::EISDIR),
            (true, true) if !n.entries.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.touch_dir(parent, name, None);
        let n = self.node_mut(ino)?;
        n.nlink = n.nlink.saturating_sub(1);
        Ok(())
    }

    pub fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        noreplace: bool,
    ) -> Res<()> {
        if noreplace && self.refuse_noreplace {
            return Err(libc::EINVAL);
        }
        let ino = self.lookup(parent, name)?;
        match self.lookup(newparent, newname) {
            Ok(old) if old == ino => return Ok(()),
            Ok(_) if noreplace => return Err(libc::EEXIST),
            Ok(old) => {
                let is_dir = self.node(old)?.kind == Kind::Dir;
                if is_dir != (self.node(ino)?.kind == Kind::Dir) {
                    return Err(if is_dir { libc::EISDIR } else { libc::ENOTDIR });
                }
                self.remove(newparent, newname, is_dir)?;
            }
            Err(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        self.touch_dir(parent, name, None);
        self.touch_dir(newparent, newname, Some(ino));
        Ok(())
    }

    /// An fsync (or fdatasync, or fsyncdir) of `ino`: one durability point.
    pub fn fsync(&mut self, ino: u64) -> Res<()> {
        let n = self.node(ino)?.clone();
        self.syncs += 1;
        self.durable.insert(ino, n);
        if self.armed == Some(self.syncs) {
            self.cut_at = Some(self.syncs);
            self.dead = true;
        }
        Ok(())
    }

    /// Makes everything durable at once, as `sync(1)` and a clean unmount
    /// would; not a durability point (used to set a test's stage).
    pub fn sync_all(&mut self) {
        self.durable = self.live.clone();
    }

    /// The power goes off now: every operation fails until [`Model::restore`].
    pub fn cut(&mut self) {
        if !self.dead {
            self.dead = true;
            self.cut_at = Some(self.syncs);
        }
    }

    /// The power comes back: `live` becomes what survived, the cut is
    /// disarmed and the count of durability points starts again.
    pub fn restore(&mut self) {
        let mut live = HashMap::new();
        let mut stack = vec![ROOT];
        while let Some(ino) = stack.pop() {
            if live.contains_key(&ino) {
                continue;
            }
            let mut n = match self.durable.get(&ino) {
                Some(d) => d.clone(),
                None => {
                    let l = &self.live[&ino];
                    let mut n = Node::new(l.kind, l.mode, l.uid, l.gid);
                    n.mtime = l.mtime;
                    n
                }
            };
            n.nlink = 0;
            stack.extend(n.entries.values().copied());
            live.insert(ino, n);
        }
        let links: Vec<u64> = live
            .values()
            .flat_map(|n| n.entries.values().copied())
            .collect();
        for ino in links {
            live.get_mut(&ino).expect("reachable").nlink += 1;
        }
        for n in live.values_mut() {
            if n.kind == Kind::Dir {
                n.nlink = 2;
            }
        }
        live.get_mut(&ROOT).expect("the root survives").nlink = 2;
        self.durable.retain(|ino, _| live.contains_key(ino));
        self.live = live;
        self.dead = false;
        self.armed = None;
        self.syncs = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(m: &mut Model, dir: u64, name: &str, data: &[u8]) -> u64 {
        let ino = m.create(dir, OsStr::new(name), Node::new(Kind::File, 0o600, 0, 0));
        let ino = ino.unwrap();
        m.node_mut(ino).unwrap().data = data.to_vec();
        ino
    }

    #[test]
    fn a_name_survives_only_by_its_directorys_fsync_and_data_by_the_files() {
        let mut m = Model::default();
        let d = m
            .create(ROOT, OsStr::new("d"), Node::new(Kind::Dir, 0o700, 0, 0))
            .unwrap();
        m.fsync(ROOT).unwrap();
        let a = file(&mut m, d, "a", b"aaa");
        let b = file(&mut m, d, "b", b"bbb");
        m.fsync(a).unwrap();
        m.fsync(d).unwrap();
        m.node_mut(b).unwrap().data = b"changed".to_vec();
        file(&mut m, d, "c", b"ccc");
        m.cut();
        assert!(m.node(ROOT).is_err(), "a dead file system answers nothing");
        m.restore();
        let names: Vec<_> = m.live[&d].entries.keys().cloned().collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(m.live[&a].data, b"aaa");
        assert_eq!(m.live[&b].data, b"", "b's data was never fsynced");
    }

    #[test]
    fn a_rename_not_followed_by_fsync_of_both_directories_is_half_lost() {
        let mut m = Model::default();
        let t = m
            .create(ROOT, OsStr::new("t"), Node::new(Kind::Dir, 0o700, 0, 0))
            .unwrap();
        let n = m
            .create(ROOT, OsStr::new("n"), Node::new(Kind::Dir, 0o700, 0, 0))
            .unwrap();
        let f = file(&mut m, t, "x", b"x");
        m.sync_all();
        m.rename(t, OsStr::new("x"), n, OsStr::new("x"), true)
            .unwrap();
        m.fsync(n).unwrap();
        m.armed = Some(2);
        m.fsync(f).unwrap();
        assert!(m.dead && m.cut_at == Some(2), "the armed cut fires");
        m.restore();
        assert_eq!(m.lookup(t, OsStr::new("x")), Ok(f));
        assert_eq!(m.lookup(n, OsStr::new("x")), Ok(f));
        assert_eq!(m.live[&f].nlink, 2, "both names survive: two links");
    }
}
