//! How a setting's text becomes its value: percent-decoded, a boolean, a port, a count, seconds,
//! an identifier; each refusal names the setting.

use crate::error::{Error, Result};

pub(crate) fn decode(value: &str, what: &str) -> Result<String> {
    percent_encoding::percent_decode_str(value)
        .decode_utf8()
        .map(|v| v.into_owned())
        .map_err(|_| {
            Error::InvalidConfig(format!(
                "the URI's {what} is not valid UTF-8 after percent-decoding"
            ))
        })
}

pub(crate) fn parse_bool(name: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" | "" => Ok(false),
        _ => Err(Error::InvalidConfig(format!(
            "'{name}' must be true or false, not '{value}'"
        ))),
    }
}

pub(crate) fn parse_port(value: &str) -> Result<u16> {
    match value.trim().parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(Error::InvalidConfig(format!(
            "invalid port '{value}': expected a number from 1 to 65535"
        ))),
    }
}

/// A whole number from 0 to `max`; the error says what it counts (`unit`) and what 0 means.
pub(crate) fn parse_count(
    name: &str,
    value: &str,
    max: u32,
    unit: &str,
    zero: &str,
) -> Result<u32> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| {
            Error::InvalidConfig(format!(
                "'{name}' must be a number{unit} from 0{zero} to {max}, not '{value}'"
            ))
        })
}

pub(crate) fn parse_seconds(name: &str, value: &str, zero_ok: bool) -> Result<u64> {
    let seconds: f64 = value.trim().parse().map_err(|_| {
        Error::InvalidConfig(format!(
            "'{name}' must be a number of seconds, not '{value}'"
        ))
    })?;
    if !seconds.is_finite() || seconds < 0.0 || (!zero_ok && seconds == 0.0) || seconds > 86_400.0 {
        return Err(Error::InvalidConfig(format!(
            "'{name}' is out of range: {value}"
        )));
    }
    Ok((seconds * 1000.0).round() as u64)
}

/// Names of databases and tables: plain identifiers only, so no quoting trick can matter.
pub fn validate_identifier(what: &str, name: &str) -> Result<()> {
    let mut chars = name.chars();
    let valid = match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {
            chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        _ => false,
    };
    if valid && name.len() <= 206 {
        Ok(())
    } else {
        Err(Error::InvalidConfig(format!(
            "{what} name {name:?} is not allowed: use letters, digits and underscores, starting with a letter or underscore"
        )))
    }
}
