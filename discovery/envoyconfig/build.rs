//! Embeds the protobuf descriptor set that the `envoy-types` crate ships
//! (`src/generated/types.bin`, built by protoc with every option kept) but does not export,
//! without its source code info: the proto files' comments and spans, four fifths of its
//! 3.3 MB, which nothing here reads and which the decoded pool would otherwise hold in memory
//! in every process that converts or validates a config.
//!
//! Why this way: protox cannot compile Envoy's whole proto tree as one set, and a copy checked
//! into this repository would drift from the prost structs of the `envoy-types` version in
//! Cargo.lock. Asking cargo itself (`cargo metadata`) where the resolved `envoy-types`
//! package lives works for registry, vendored and git sources alike, and always picks the
//! exact version this crate is compiled against.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    if let Err(err) = run() {
        // A build script reports failure by exiting non-zero with a message.
        eprintln!("error: cannot embed the Envoy descriptor set: {err}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let manifest_dir = env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?;
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let metadata = cargo_metadata(Path::new(&manifest_dir))?;

    let packages = metadata["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?;
    let this_id = packages
        .iter()
        .find(|p| p["manifest_path"].as_str() == Some(&format!("{manifest_dir}/Cargo.toml")))
        .and_then(|p| p["id"].as_str())
        .ok_or("cargo metadata: this package is missing")?;
    // The envoy-types this crate depends on, even if several versions are in the graph.
    let envoy_id = metadata["resolve"]["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["id"].as_str() == Some(this_id)))
        .and_then(|n| n["deps"].as_array())
        .and_then(|deps| {
            deps.iter()
                .find(|d| d["name"].as_str() == Some("envoy_types"))
        })
        .and_then(|d| d["pkg"].as_str())
        .ok_or("cargo metadata: no envoy-types dependency")?;
    let envoy_manifest = packages
        .iter()
        .find(|p| p["id"].as_str() == Some(envoy_id))
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("cargo metadata: envoy-types package missing")?;
    let source = Path::new(envoy_manifest)
        .parent()
        .ok_or("envoy-types manifest has no folder")?
        .join("src/generated/types.bin");
    let bytes = std::fs::read(&source).map_err(|e| format!("{}: {e}", source.display()))?;
    let stripped = without_source_info(&bytes).map_err(|e| format!("{}: {e}", source.display()))?;
    std::fs::write(out_dir.join("envoy_descriptors.bin"), stripped).map_err(|e| e.to_string())?;

    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed=build.rs");
    // A new envoy-types version shows up as a Cargo.lock change, not as a change of this crate.
    if let Some(root) = metadata["workspace_root"].as_str() {
        println!("cargo:rerun-if-changed={root}/Cargo.lock");
    }
    Ok(())
}

fn cargo_metadata(manifest_dir: &Path) -> Result<serde_json::Value, String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = manifest_dir.join("Cargo.toml");
    // Offline first: the outer build has already fetched everything; fall back to a normal
    // run if cargo's cache lacks a manifest that only metadata needs.
    let mut last_err = String::new();
    for offline in [true, false] {
        let mut cmd = Command::new(&cargo);
        cmd.args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(&manifest);
        if offline {
            cmd.arg("--offline");
        }
        let out = cmd.output().map_err(|e| format!("running {cargo}: {e}"))?;
        if out.status.success() {
            return serde_json::from_slice(&out.stdout).map_err(|e| e.to_string());
        }
        last_err = String::from_utf8_lossy(&out.stderr).into_owned();
    }
    Err(format!("cargo metadata failed: {last_err}"))
}

/// `set` (a `FileDescriptorSet`) with each file's `source_code_info` (field 9 of
/// `FileDescriptorProto`) left out and every other byte as it was, custom options included.
/// Done on the wire: decoding into `prost_types` would drop the options' extensions.
fn without_source_info(mut set: &[u8]) -> Result<Vec<u8>, String> {
    use prost::bytes::Buf;
    use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};
    const FILE: u32 = 1;
    const SOURCE_CODE_INFO: u32 = 9;
    let mut out = Vec::with_capacity(set.len());
    while set.has_remaining() {
        let (tag, wire) = decode_key(&mut set).map_err(|e| e.to_string())?;
        if tag != FILE || wire != WireType::LengthDelimited {
            return Err(format!(
                "unexpected field {tag} ({wire:?}) in a descriptor set"
            ));
        }
        let len = usize::try_from(decode_varint(&mut set).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        if len > set.len() {
            return Err("a file descriptor runs past the end of the set".into());
        }
        let (mut file, rest) = set.split_at(len);
        set = rest;
        let mut kept = Vec::with_capacity(len);
        while file.has_remaining() {
            let start = file;
            let (field, wire) = decode_key(&mut file).map_err(|e| e.to_string())?;
            let value_len = match wire {
                WireType::Varint => {
                    decode_varint(&mut file).map_err(|e| e.to_string())?;
                    0
                }
                WireType::SixtyFourBit => 8,
                WireType::ThirtyTwoBit => 4,
                WireType::LengthDelimited => {
                    let n = decode_varint(&mut file).map_err(|e| e.to_string())?;
                    usize::try_from(n).map_err(|e| e.to_string())?
                }
                other => return Err(format!("unexpected {other:?} field in a file descriptor")),
            };
            if value_len > file.len() {
                return Err(format!(
                    "field {field} runs past the end of its file descriptor"
                ));
            }
            file.advance(value_len);
            if field != SOURCE_CODE_INFO {
                kept.extend_from_slice(&start[..start.len() - file.len()]);
            }
        }
        encode_key(FILE, WireType::LengthDelimited, &mut out);
        encode_varint(kept.len() as u64, &mut out);
        out.extend_from_slice(&kept);
    }
    Ok(out)
}
