//! Reading PEM blocks, with errors that say which block was expected.

use x509_parser::pem::Pem;

use crate::error::CertError;

/// Every PEM block in `input`, in order.
pub fn blocks(input: &str) -> Result<Vec<Pem>, CertError> {
    Pem::iter_from_buffer(input.as_bytes())
        .map(|block| block.map_err(CertError::Pem))
        .collect()
}

/// The contents of every block with the given label; an error when there is none.
pub fn blocks_labelled(input: &str, label: &'static str) -> Result<Vec<Vec<u8>>, CertError> {
    let found: Vec<Vec<u8>> = blocks(input)?
        .into_iter()
        .filter(|b| b.label == label)
        .map(|b| b.contents)
        .collect();
    if found.is_empty() {
        return Err(CertError::NoPemBlock { expected: label });
    }
    Ok(found)
}

pub fn first_block(input: &str, label: &'static str) -> Result<Vec<u8>, CertError> {
    blocks_labelled(input, label)?
        .into_iter()
        .next()
        .ok_or(CertError::NoPemBlock { expected: label })
}

/// The DER of a PKCS#8 private key, with a clear error for the older PEM key formats.
pub fn private_key_der(input: &str) -> Result<Vec<u8>, CertError> {
    let all = blocks(input)?;
    if let Some(block) = all.iter().find(|b| b.label == "PRIVATE KEY") {
        return Ok(block.contents.clone());
    }
    if let Some(block) = all
        .iter()
        .find(|b| b.label == "RSA PRIVATE KEY" || b.label == "EC PRIVATE KEY")
    {
        return Err(CertError::KeyFormat {
            label: block.label.clone(),
        });
    }
    Err(CertError::NoPemBlock {
        expected: "PRIVATE KEY",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_legacy_blocks_are_named() {
        assert!(matches!(
            private_key_der("garbage"),
            Err(CertError::NoPemBlock {
                expected: "PRIVATE KEY"
            })
        ));
        let legacy = "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n";
        let err = private_key_der(legacy).unwrap_err().to_string();
        assert!(
            err.contains("EC PRIVATE KEY") && err.contains("PKCS#8"),
            "{err}"
        );
        let broken = "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n";
        assert!(matches!(blocks(broken), Err(CertError::Pem(_))));
    }
}
