//! The job's durable checkpoint store: the tier that outlives every node of the cluster.
//!
//! Peers' disks are the fast tier of checkpoints, and they vanish with spot VMs; a zone that
//! goes to zero machines for hours takes them all. Every stage part of a checkpoint cut is
//! therefore also uploaded here (in the background, after the local copy), and once raft
//! registers a cut as complete with every part stored, its manifest is written: a new cluster
//! started on fresh disks with the same store resumes from the newest manifest
//! (`Command::AdoptCut`).
//!
//! The store is reached through the `object_store` crate: a local directory (a path or
//! `file://`), or `s3://`, `gs://`, `az://` URLs with credentials and endpoints from the
//! environment as the cloud SDKs take them (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT`,
//! `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...).
//!
//! Layout under the store's prefix, one directory per job (its digest):
//! `JOB/parts/STEPS-START-END-SHA256.state` (the digest in the name: parts of two histories
//! never collide) and `JOB/cuts/HISTORY-STEP.json` (the cut as raft registered it).

use std::ops::Range;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parcae_consensus::state::{Cut, CutPart, Digest32};
use sha2::{Digest, Sha256};

/// Largest cut manifest read back (a cut names at most a few thousand parts).
const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// Complete stored cuts whose manifests and parts are kept by default (older ones are
/// deleted; `[train] keep_checkpoints`).
pub const KEEP_STORED_CUTS: usize = 2;

/// Most manifests read back by [`JobStore::stored_cuts`] (a run that keeps every cut of a
/// checkpoint every 20 steps holds 5,000 after 100,000 steps).
const MAX_LISTED_CUTS: usize = 1 << 20;

/// The largest checkpoint part a store holds for a model of `params` parameters: weights and
/// two moments in f32, with room for the headers.
pub fn max_part_bytes(params: usize) -> u64 {
    params as u64 * 12 + (16 << 20)
}

/// The store could not be opened, read or written, or holds something unusable.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The location is not a path or a supported URL.
    #[error("checkpoint store {location}: {reason}")]
    Location {
        /// The location given.
        location: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store answered with an error.
    #[error("checkpoint store {location}: {source}")]
    Store {
        /// The store.
        location: String,
        /// What it said.
        source: object_store::Error,
    },
    /// An object is larger than allowed, or a manifest does not decode.
    #[error("checkpoint store {location}: {object}: {reason}")]
    Invalid {
        /// The store.
        location: String,
        /// The object.
        object: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A job's directory in a durable store.
#[derive(Clone)]
pub struct JobStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
    location: String,
    /// Complete cuts kept (0: all).
    keep_cuts: usize,
}

impl std::fmt::Debug for JobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JobStore({}/{})", self.location, self.root)
    }
}

impl JobStore {
    /// The store at `location` (a directory path, `file://`, `s3://`, `gs://` or `az://` URL),
    /// holding the job whose digest is `job`. A local directory is created if missing.
    pub fn open(location: &str, job: &Digest32) -> Result<Self, StoreError> {
        let (store, prefix) = open_location(location)?;
        Ok(Self {
            store,
            root: prefix.join(hex::encode(&job[..16])),
            location: location.to_string(),
            keep_cuts: KEEP_STORED_CUTS,
        })
    }

    /// This store, keeping the newest `cuts` complete cuts when it writes one (0: every cut,
    /// for a run whose whole history is checked afterwards: `parcae-node replay`).
    pub fn keeping(mut self, cuts: usize) -> Self {
        self.keep_cuts = cuts;
        self
    }

    /// The one job in the store at `location`, or the one whose directory name starts with
    /// `job` (for reading a store without the job's configuration: `parcae-node export`).
    pub async fn open_existing(location: &str, job: Option<&str>) -> Result<Self, StoreError> {
        let (store, prefix) = open_location(location)?;
        let listed = store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|source| StoreError::Store {
                location: location.to_string(),
                source,
            })?;
        let jobs: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .filter(|name| job.is_none_or(|j| name.starts_with(j)))
            .collect();
        match jobs.as_slice() {
            [one] => Ok(Self {
                store,
                root: prefix.join(one.as_str()),
                location: location.to_string(),
                keep_cuts: KEEP_STORED_CUTS,
            }),
            [] => Err(StoreError::Location {
                location: location.to_string(),
                reason: format!(
                    "no job {}in the store",
                    job.map_or(String::new(), |j| format!("{j}* "))
                ),
            }),
            many => Err(StoreError::Location {
                location: location.to_string(),
                reason: format!("several jobs, name one: {}", many.join(", ")),
            }),
        }
    }

    fn error(&self, source: object_store::Error) -> StoreError {
        StoreError::Store {
            location: self.location.clone(),
            source,
        }
    }

    fn part_path(&self, steps: u64, layers: &Range<u32>, digest: &Digest32) -> Path {
        self.root.clone().join("parts").join(format!(
            "{steps}-{}-{}-{}.state",
            layers.start,
            layers.end,
            hex::encode(digest)
        ))
    }

    fn cut_path(&self, history: u64, step: u64) -> Path {
        self.root
            .clone()
            .join("cuts")
            .join(format!("{history:020}-{step:020}.json"))
    }

    /// Uploads one stage part of the cut of `steps` steps.
    pub async fn put_part(
        &self,
        steps: u64,
        layers: Range<u32>,
        digest: &Digest32,
        bytes: Vec<u8>,
    ) -> Result<(), StoreError> {
        let path = self.part_path(steps, &layers, digest);
        self.store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// Downloads a stage part of the cut of `steps` steps, refusing one over `max_bytes`.
    /// The caller checks the bytes against the digest raft committed.
    pub async fn get_part(
        &self,
        steps: u64,
        part: &CutPart,
        max_bytes: u64,
    ) -> Result<Vec<u8>, StoreError> {
        let layers = part.layers.start..part.layers.end;
        let path = self.part_path(steps, &layers, &part.digest);
        self.get_bounded(&path, max_bytes).await
    }

    /// [`JobStore::get_part`], refusing bytes that do not match the part's digest.
    pub async fn get_verified_part(
        &self,
        steps: u64,
        part: &CutPart,
        max_bytes: u64,
    ) -> Result<Vec<u8>, StoreError> {
        let bytes = self.get_part(steps, part, max_bytes).await?;
        if Sha256::digest(&bytes).as_slice() != part.digest {
            return Err(StoreError::Invalid {
                location: self.location.clone(),
                object: format!("layers {:?} after {steps} steps", part.layers),
                reason: "the bytes do not match the digest of the cut's manifest".into(),
            });
        }
        Ok(bytes)
    }

    async fn get_bounded(&self, path: &Path, max_bytes: u64) -> Result<Vec<u8>, StoreError> {
        let got = self.store.get(path).await.map_err(|e| self.error(e))?;
        if got.meta.size > max_bytes {
            return Err(StoreError::Invalid {
                location: self.location.clone(),
                object: path.to_string(),
                reason: format!("{} bytes (at most {max_bytes})", got.meta.size),
            });
        }
        let bytes = got.bytes().await.map_err(|e| self.error(e))?;
        Ok(bytes.to_vec())
    }

    /// Writes the manifest of a complete cut whose every part is stored, then deletes the
    /// manifests and parts of all but the newest kept stored cuts ([`JobStore::keeping`];
    /// parts newer than every kept cut stay: they are uploads of cuts not complete yet).
    pub async fn put_cut(&self, cut: &Cut) -> Result<(), StoreError> {
        self.put_manifest(cut).await?;
        self.prune().await
    }

    async fn put_manifest(&self, cut: &Cut) -> Result<(), StoreError> {
        let json = serde_json::to_vec(cut).map_err(|e| StoreError::Invalid {
            location: self.location.clone(),
            object: "cut".into(),
            reason: e.to_string(),
        })?;
        self.store
            .put(
                &self.cut_path(cut.history, cut.end.step),
                PutPayload::from(json),
            )
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// Copies the newest complete cut of `from` (another store of this job: a backup, or the
    /// store of an earlier cluster) into this one, each part checked against the digest its
    /// manifest names and written before the manifest. Nothing here is pruned: the copy may be
    /// older than the cuts this store holds. `None` when `from` holds no cut.
    pub async fn copy_newest_from(
        &self,
        from: &JobStore,
        max_bytes: u64,
    ) -> Result<Option<Cut>, StoreError> {
        let Some(cut) = from.newest_cut().await? else {
            return Ok(None);
        };
        let steps = cut.steps_trained();
        for part in &cut.parts {
            let bytes = from.get_verified_part(steps, part, max_bytes).await?;
            let layers = part.layers.start..part.layers.end;
            self.put_part(steps, layers, &part.digest, bytes).await?;
        }
        self.put_manifest(&cut).await?;
        Ok(Some(cut))
    }

    /// The manifests in the store as `(history, step, path)`, newest first.
    async fn manifests(&self) -> Result<Vec<(u64, u64, Path)>, StoreError> {
        let listed: Vec<_> = self
            .store
            .list(Some(&self.root.clone().join("cuts")))
            .try_collect()
            .await
            .map_err(|e| self.error(e))?;
        let mut cuts: Vec<(u64, u64, Path)> = listed
            .into_iter()
            .filter_map(|meta| {
                let (history, step) = parse_cut_name(meta.location.filename()?)?;
                Some((history, step, meta.location))
            })
            .collect();
        cuts.sort_by_key(|c| std::cmp::Reverse((c.0, c.1)));
        Ok(cuts)
    }

    /// The newest stored cut (of the latest history, the latest step), or with `steps` the
    /// newest one holding the state after that many steps. A manifest that does not decode, or
    /// names an incomplete cut, is an error (the store was tampered with).
    pub async fn stored_cut(&self, steps: Option<u64>) -> Result<Option<Cut>, StoreError> {
        self.newest_cut_where(|_, step| steps.is_none_or(|s| step + 1 == s))
            .await
    }

    /// The newest stored cut that holds the state entering a step before `next` and that
    /// `held` (the cuts a cluster holds, as `(history, step)`) does not name: what a stopped
    /// cluster can resume from.
    pub async fn newest_cut_not_held(
        &self,
        next: u64,
        held: &[(u64, u64)],
    ) -> Result<Option<Cut>, StoreError> {
        self.newest_cut_where(|history, step| step < next && !held.contains(&(history, step)))
            .await
    }

    async fn newest_cut_where(
        &self,
        wanted: impl Fn(u64, u64) -> bool,
    ) -> Result<Option<Cut>, StoreError> {
        let Some((_, _, path)) = self
            .manifests()
            .await?
            .into_iter()
            .find(|(history, step, _)| wanted(*history, *step))
        else {
            return Ok(None);
        };
        self.read_manifest(&path).await.map(Some)
    }

    /// The cut a manifest names; an error where it does not decode or is not a complete
    /// stored cut (the store was tampered with).
    async fn read_manifest(&self, path: &Path) -> Result<Cut, StoreError> {
        let bytes = self.get_bounded(path, MAX_MANIFEST_BYTES).await?;
        let invalid = |reason: String| StoreError::Invalid {
            location: self.location.clone(),
            object: path.to_string(),
            reason,
        };
        let cut: Cut = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        if !cut.is_stored() {
            return Err(invalid("not a complete stored cut".into()));
        }
        Ok(cut)
    }

    /// Every stored cut, oldest first (by history, then step).
    pub async fn stored_cuts(&self) -> Result<Vec<Cut>, StoreError> {
        let manifests = self.manifests().await?;
        if manifests.len() > MAX_LISTED_CUTS {
            return Err(StoreError::Invalid {
                location: self.location.clone(),
                object: "cuts".into(),
                reason: format!(
                    "{} manifests (at most {MAX_LISTED_CUTS} are read)",
                    manifests.len()
                ),
            });
        }
        let mut cuts = Vec::with_capacity(manifests.len());
        for (_, _, path) in manifests.iter().rev() {
            cuts.push(self.read_manifest(path).await?);
        }
        Ok(cuts)
    }

    /// The newest stored cut ([`JobStore::stored_cut`]).
    pub async fn newest_cut(&self) -> Result<Option<Cut>, StoreError> {
        self.stored_cut(None).await
    }

    async fn prune(&self) -> Result<(), StoreError> {
        if self.keep_cuts == 0 {
            return Ok(());
        }
        let manifests = self.manifests().await?;
        let mut keep_parts = Vec::new();
        for (_, _, path) in manifests.iter().take(self.keep_cuts) {
            let bytes = self.get_bounded(path, MAX_MANIFEST_BYTES).await?;
            if let Ok(cut) = serde_json::from_slice::<Cut>(&bytes) {
                let steps = cut.steps_trained();
                let groups = cut.groups.iter().flat_map(|g| &g.parts);
                keep_parts.extend(
                    cut.parts
                        .iter()
                        .chain(groups)
                        .map(|p| self.part_path(steps, &(p.layers.start..p.layers.end), &p.digest)),
                );
            }
        }
        let Some(oldest_kept) = manifests
            .iter()
            .take(self.keep_cuts)
            .map(|(_, step, _)| *step + 1)
            .min()
        else {
            return Ok(());
        };
        let mut doomed: Vec<Path> = manifests
            .into_iter()
            .skip(self.keep_cuts)
            .map(|(_, _, path)| path)
            .collect();
        let parts: Vec<_> = self
            .store
            .list(Some(&self.root.clone().join("parts")))
            .try_collect()
            .await
            .map_err(|e| self.error(e))?;
        doomed.extend(
            parts
                .into_iter()
                .map(|meta| meta.location)
                .filter(|path| !keep_parts.contains(path))
                .filter(|path| {
                    path.filename()
                        .and_then(|n| n.split('-').next()?.parse::<u64>().ok())
                        .is_some_and(|steps| steps <= oldest_kept)
                }),
        );
        for path in doomed {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.error(e)),
            }
        }
        Ok(())
    }
}

/// The object store at `location` and the prefix under it.
fn open_location(location: &str) -> Result<(Arc<dyn ObjectStore>, Path), StoreError> {
    let bad = |reason: String| StoreError::Location {
        location: location.to_string(),
        reason,
    };
    if location.contains("://") {
        let env = std::env::vars().map(|(k, v)| (k.to_ascii_lowercase(), v));
        open_url(location, env).map_err(bad)
    } else {
        std::fs::create_dir_all(location).map_err(|e| bad(e.to_string()))?;
        let local = object_store::local::LocalFileSystem::new_with_prefix(location)
            .map_err(|e| bad(e.to_string()))?;
        Ok((Arc::new(local), Path::default()))
    }
}

/// A cloud store (`s3://`, `gs://`, `az://`, `http(s)://`) configured by `options` (the cloud
/// SDKs' environment names, lower case).
fn open_url(
    location: &str,
    options: impl IntoIterator<Item = (String, String)>,
) -> Result<(Arc<dyn ObjectStore>, Path), String> {
    // reqwest is built without a crypto provider of its own (that would be aws-lc, a C library
    // CI would compile for minutes): TLS runs on ring, installed once for the process.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let url = url::Url::parse(location).map_err(|e| e.to_string())?;
    let (store, prefix) = object_store::parse_url_opts(&url, options).map_err(|e| e.to_string())?;
    Ok((Arc::from(store), prefix))
}

fn parse_cut_name(name: &str) -> Option<(u64, u64)> {
    let (history, step) = name.strip_suffix(".json")?.split_once('-')?;
    Some((history.parse().ok()?, step.parse().ok()?))
}

#[cfg(test)]
mod tests;
