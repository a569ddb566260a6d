//! `marin3r crds`: print (or write) the CRDs generated from the Rust types, or their API
//! reference as Markdown.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use crate::{crds, olm};
use marin3r_api::reference;

#[derive(Debug, Args)]
pub struct CrdsArgs {
    /// Write one file per CRD into this folder instead of printing them.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Write the API reference (one Markdown page per CRD and a README.md index) into this
    /// folder instead.
    #[arg(long, value_name = "DIR", conflicts_with = "out_dir")]
    reference: Option<PathBuf>,
    /// Write the OLM bundle (a ClusterServiceVersion, the CRDs, metadata/annotations.yaml)
    /// into this folder instead, rendered from the kustomize install in `--manifests`.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["out_dir", "reference"])]
    olm_bundle: Option<PathBuf>,
    /// The `manifests/` folder the OLM bundle is rendered from (its kustomization.yaml,
    /// operator/ and examples/).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "manifests",
        requires = "olm_bundle"
    )]
    manifests: PathBuf,
}

pub fn run(args: CrdsArgs) -> anyhow::Result<()> {
    let all = crds::all();
    if let Some(dir) = args.olm_bundle {
        let sources = olm::Sources::read(&args.manifests)?;
        let files = olm::render(&all, &sources, env!("CARGO_PKG_VERSION"))?;
        return write_files(&dir, files);
    }
    if let Some(dir) = args.reference {
        let mut pages: Vec<(String, String)> = all
            .iter()
            .map(|crd| (reference::file_name(crd), reference::render(crd)))
            .collect();
        pages.push(("README.md".to_owned(), reference::index(&all)));
        return write_files(&dir, pages);
    }
    match args.out_dir {
        None => {
            for crd in &all {
                print!("---\n{}", crds::to_yaml(crd)?);
            }
        }
        Some(dir) => {
            let files = all
                .iter()
                .map(|crd| Ok((crds::file_name(crd), crds::to_yaml(crd)?)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            write_files(&dir, files)?;
        }
    }
    Ok(())
}

fn write_files(dir: &Path, files: Vec<(String, String)>) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
