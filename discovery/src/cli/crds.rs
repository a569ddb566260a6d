//! `marin3r crds`: print (or write) the CRDs generated from the Rust types.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::crds;

#[derive(Debug, Args)]
pub struct CrdsArgs {
    /// Write one file per CRD into this folder instead of printing them.
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

pub fn run(args: CrdsArgs) -> anyhow::Result<()> {
    let all = crds::all();
    match args.out_dir {
        None => {
            for crd in &all {
                print!("---\n{}", crds::to_yaml(crd)?);
            }
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for crd in &all {
                let path = dir.join(crds::file_name(crd));
                std::fs::write(&path, crds::to_yaml(crd)?)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
