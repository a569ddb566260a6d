//! `marin3r crds`: print (or write) the CRDs generated from the Rust types, or their API
//! reference as Markdown.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use crate::crds;
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
}

pub fn run(args: CrdsArgs) -> anyhow::Result<()> {
    let all = crds::all();
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
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
