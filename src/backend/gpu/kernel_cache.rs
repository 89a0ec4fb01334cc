//! The compiled kernels kept on disk, so that a process pays NVRTC once per kernel source,
//! options, compiler and device architecture, not once per process.
//!
//! Each entry is one file, `<key>.cubin` in the cache directory
//! ([`crate::tuning::Env::kernel_cache`]):
//!
//! | bytes | what |
//! | --- | --- |
//! | 8 | the magic `DFSKERN1` |
//! | 32 | the key: BLAKE3 of everything the image depends on (below) |
//! | 8 | the image's length, little-endian |
//! | 32 | BLAKE3 of the image |
//! | n | the image (a CUBIN for the device's `sm_XY`) |
//!
//! The key hashes the crate's version, NVRTC's version, the architecture, the program's
//! name, every compile option and the whole source, each length-prefixed. A file that is
//! short, of another key, or whose image does not hash to its checksum is ignored (and
//! replaced by the next compile), so a damaged or foreign file costs a compile, never a wrong
//! kernel. Files are written to a temporary name and renamed into place, so processes that
//! compile the same kernel at once each see a whole file or none. Nothing here is required:
//! a directory that cannot be created or written only means compiling every time.

use std::io::Write as _;
use std::path::Path;

const MAGIC: &[u8; 8] = b"DFSKERN1";
const HEADER: usize = 8 + 32 + 8 + 32;

/// What a compiled image depends on, hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key([u8; 32]);

impl Key {
    /// The key of `parts` (each length-prefixed, so no two lists of parts share a key by
    /// concatenation).
    pub(crate) fn of<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut h = blake3::Hasher::new();
        for p in parts {
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p);
        }
        Key(*h.finalize().as_bytes())
    }

    fn file_name(&self) -> String {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        format!("{hex}.cubin")
    }
}

/// The image stored under `key` in `dir`, if a whole, matching entry is there.
pub(crate) fn read(dir: &Path, key: &Key) -> Option<Vec<u8>> {
    let bytes = std::fs::read(dir.join(key.file_name())).ok()?;
    let (header, image) = bytes.split_at_checked(HEADER)?;
    let (magic, rest) = header.split_at(8);
    let (stored_key, rest) = rest.split_at(32);
    let (len, sum) = rest.split_at(8);
    let len = u64::from_le_bytes(len.try_into().ok()?);
    let whole = magic == MAGIC
        && stored_key == key.0
        && len == image.len() as u64
        && blake3::hash(image).as_bytes() == sum;
    whole.then(|| image.to_vec())
}

/// Stores `image` under `key` in `dir` (created if missing), replacing any entry there.
pub(crate) fn write(dir: &Path, key: &Key, image: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(key.file_name());
    let tmp = dir.join(format!(
        "{}.{}.{:?}.tmp",
        key.file_name(),
        std::process::id(),
        std::thread::current().id()
    ));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(MAGIC)?;
        f.write_all(&key.0)?;
        f.write_all(&(image.len() as u64).to_le_bytes())?;
        f.write_all(blake3::hash(image).as_bytes())?;
        f.write_all(image)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Key {
        Key::of([b"v1".as_slice(), s.as_bytes()])
    }

    #[test]
    fn an_entry_reads_back_under_its_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let image = b"\x7fELF a cubin".repeat(100);
        write(dir.path(), &key("a"), &image).unwrap();
        assert_eq!(read(dir.path(), &key("a")), Some(image.clone()));
        assert_eq!(read(dir.path(), &key("b")), None);
        // Rewriting replaces.
        write(dir.path(), &key("a"), b"other").unwrap();
        assert_eq!(read(dir.path(), &key("a")).as_deref(), Some(&b"other"[..]));
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn keys_separate_their_parts() {
        let ab = Key::of([b"a".as_slice(), b"b".as_slice()]);
        assert_ne!(ab, Key::of([b"ab".as_slice()]));
        assert_ne!(
            ab,
            Key::of([b"a".as_slice(), b"b".as_slice(), b"".as_slice()])
        );
        assert_eq!(ab, Key::of([b"a".as_slice(), b"b".as_slice()]));
    }

    #[test]
    fn damaged_or_foreign_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("k");
        let path = dir.path().join(k.file_name());
        write(dir.path(), &k, b"0123456789").unwrap();
        let good = std::fs::read(&path).unwrap();
        // Truncated: in the header, and in the image.
        for cut in [0, 7, HEADER - 1, good.len() - 1] {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert_eq!(read(dir.path(), &k), None, "cut at {cut}");
        }
        // One flipped byte anywhere: magic, key, length, checksum, image.
        for at in [0, 8, 40, 48, HEADER, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 1;
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(read(dir.path(), &k), None, "flipped byte {at}");
        }
        // A longer file than its header says.
        let mut long = good.clone();
        long.push(0);
        std::fs::write(&path, &long).unwrap();
        assert_eq!(read(dir.path(), &k), None);
        // Another key's entry copied under this name.
        write(dir.path(), &key("other"), b"0123456789").unwrap();
        std::fs::copy(dir.path().join(key("other").file_name()), &path).unwrap();
        assert_eq!(read(dir.path(), &k), None);
        // Whole again.
        std::fs::write(&path, &good).unwrap();
        assert_eq!(read(dir.path(), &k).as_deref(), Some(&b"0123456789"[..]));
    }

    #[test]
    fn an_unwritable_directory_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        // A directory under a regular file cannot be created.
        assert!(write(&file.join("kernels"), &key("k"), b"img").is_err());
        assert_eq!(read(&file.join("kernels"), &key("k")), None);
    }
}
