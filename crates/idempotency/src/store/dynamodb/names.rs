//! The record's attribute names and the table's key: the partition key alone, or a
//! partition key holding one static value and a sort key holding the stored id.

use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;
use std::fmt;

/// The attribute names of the record, Powertools' by default. Change a field of
/// `AttributeNames::default()` to rename one attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttributeNames {
    /// The partition key. Default `id`. It holds the stored id, or, with a sort key
    /// ([`DynamoDbStore::sort_key_attr`](super::DynamoDbStore::sort_key_attr)), the
    /// store's static partition value.
    pub id: String,
    /// Epoch seconds, the TTL attribute. Default `expiration`.
    pub expiration: String,
    /// Epoch milliseconds. Default `in_progress_expiration`.
    pub in_progress_expiration: String,
    /// Default `status`.
    pub status: String,
    /// Default `data`.
    pub data: String,
    /// Default `validation`.
    pub validation: String,
    /// The fencing token (not in Powertools' schema). Default `lease_token`.
    pub lease_token: String,
}

impl Default for AttributeNames {
    fn default() -> Self {
        Self {
            id: "id".into(),
            expiration: "expiration".into(),
            in_progress_expiration: "in_progress_expiration".into(),
            status: "status".into(),
            data: "data".into(),
            validation: "validation".into(),
            lease_token: "lease_token".into(),
        }
    }
}

impl AttributeNames {
    /// Every name but the partition key's, each with its field's name.
    pub(super) fn record_attributes(&self) -> [(&'static str, &str); 6] {
        [
            ("expiration", &self.expiration),
            ("in_progress_expiration", &self.in_progress_expiration),
            ("status", &self.status),
            ("data", &self.data),
            ("validation", &self.validation),
            ("lease_token", &self.lease_token),
        ]
    }
}

/// DynamoDB's limit on a partition key value, in bytes.
pub(super) const MAX_PARTITION_KEY_BYTES: usize = 2048;
/// DynamoDB's limit on a sort key value, in bytes.
pub(super) const MAX_SORT_KEY_BYTES: usize = 1024;

/// The partition value a store with a sort key uses unless given one: Powertools'
/// `idempotency#<function name>`, the name read from `AWS_LAMBDA_FUNCTION_NAME` (`local`
/// outside Lambda, as the stored ids say).
pub(super) fn default_partition_value() -> String {
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "local".into());
    format!("idempotency#{function}")
}

/// How the store addresses a record: the stored id as the partition key, or a static
/// partition value with the stored id as the sort key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeyLayout {
    /// The sort key's attribute name, for a table with a sort key.
    pub(super) sort_key: Option<String>,
    /// The partition key's value when there is a sort key.
    pub(super) partition_value: String,
    /// Whether `partition_value` was given (rather than the default): given without a sort
    /// key, it is a setting that does nothing, which `check_table` refuses.
    pub(super) partition_value_given: bool,
}

impl KeyLayout {
    pub(super) fn new() -> Self {
        Self {
            sort_key: None,
            partition_value: default_partition_value(),
            partition_value_given: false,
        }
    }

    /// The primary key of the record `id`.
    pub(super) fn key(&self, names: &AttributeNames, id: &str) -> HashMap<String, AttributeValue> {
        let mut key = HashMap::with_capacity(2);
        self.insert_key(names, id, &mut key);
        key
    }

    /// Puts the primary key of the record `id` into `item`.
    pub(super) fn insert_key(
        &self,
        names: &AttributeNames,
        id: &str,
        item: &mut HashMap<String, AttributeValue>,
    ) {
        match &self.sort_key {
            None => {
                item.insert(names.id.clone(), AttributeValue::S(id.to_owned()));
            }
            Some(sort_key) => {
                item.insert(
                    names.id.clone(),
                    AttributeValue::S(self.partition_value.clone()),
                );
                item.insert(sort_key.clone(), AttributeValue::S(id.to_owned()));
            }
        }
    }

    /// The attribute that holds the stored id.
    pub(super) fn id_attribute<'a>(&'a self, names: &'a AttributeNames) -> &'a str {
        self.sort_key.as_deref().unwrap_or(&names.id)
    }

    /// The key schema this layout needs.
    pub(super) fn expected(&self, names: &AttributeNames) -> KeySchema {
        let mut elements = vec![KeyElement::string(&names.id, KeyRole::Hash)];
        if let Some(sort_key) = &self.sort_key {
            elements.push(KeyElement::string(sort_key, KeyRole::Range));
        }
        KeySchema(elements)
    }

    /// The longest stored id the key holds.
    pub(super) fn max_id_bytes(&self) -> usize {
        match self.sort_key {
            None => MAX_PARTITION_KEY_BYTES,
            Some(_) => MAX_SORT_KEY_BYTES,
        }
    }

    /// Bytes the key takes in an item besides the stored id: with a sort key, its name
    /// and the partition value.
    pub(super) fn overhead_bytes(&self) -> usize {
        match &self.sort_key {
            None => 0,
            Some(sort_key) => sort_key.len() + self.partition_value.len(),
        }
    }

    /// What makes these settings unworkable whatever the table, if anything.
    pub(super) fn problem(&self, names: &AttributeNames) -> Option<String> {
        let mut all: Vec<(&str, &str)> = vec![("partition key (id)", &names.id)];
        if let Some(sort_key) = &self.sort_key {
            all.push(("sort key", sort_key));
        }
        all.extend(names.record_attributes());
        for (i, (what, name)) in all.iter().enumerate() {
            if name.is_empty() {
                return Some(format!("the {what} attribute's name is empty"));
            }
            if let Some((other, _)) = all[..i].iter().find(|(_, earlier)| earlier == name) {
                return Some(format!(
                    "the {other} and the {what} attribute have the same name {name:?}"
                ));
            }
        }
        match &self.sort_key {
            None if self.partition_value_given => Some(format!(
                "a partition key value ({:?}) is set but no sort key: the value is only used with a sort key (DynamoDbStore::sort_key_attr)",
                self.partition_value
            )),
            Some(_) if self.partition_value.is_empty() => {
                Some("the partition key value is empty: DynamoDB refuses empty keys".into())
            }
            Some(_) if self.partition_value.len() > MAX_PARTITION_KEY_BYTES => Some(format!(
                "the partition key value is {} bytes, over DynamoDB's {MAX_PARTITION_KEY_BYTES}",
                self.partition_value.len()
            )),
            _ => None,
        }
    }
}

/// Which part of the primary key an attribute is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyRole {
    Hash,
    Range,
}

/// One attribute of a table's primary key, with its type (`S`, `N` or `B`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeyElement {
    pub(super) name: String,
    pub(super) role: KeyRole,
    pub(super) kind: String,
}

impl KeyElement {
    fn string(name: &str, role: KeyRole) -> Self {
        Self {
            name: name.to_owned(),
            role,
            kind: "S".into(),
        }
    }
}

/// A table's primary key, as `(pk HASH, sk RANGE)`; a type other than string is named
/// (`(id HASH number)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeySchema(pub(super) Vec<KeyElement>);

impl fmt::Display for KeySchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        for (i, element) in self.0.iter().enumerate() {
            let role = match element.role {
                KeyRole::Hash => "HASH",
                KeyRole::Range => "RANGE",
            };
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{} {role}", element.name)?;
            match element.kind.as_str() {
                "S" => {}
                "N" => f.write_str(" number")?,
                "B" => f.write_str(" binary")?,
                other => write!(f, " {other}")?,
            }
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single_table(sort_key: &str, value: &str) -> KeyLayout {
        KeyLayout {
            sort_key: Some(sort_key.into()),
            partition_value: value.into(),
            partition_value_given: true,
        }
    }

    #[test]
    fn the_key_is_the_id_or_the_partition_value_and_the_id() {
        let names = AttributeNames::default();
        let plain = KeyLayout::new();
        assert_eq!(
            plain.key(&names, "f.op#k"),
            HashMap::from([("id".into(), AttributeValue::S("f.op#k".into()))])
        );
        assert_eq!(plain.expected(&names).to_string(), "(id HASH)");
        assert_eq!(plain.max_id_bytes(), 2048);
        let single = single_table("sk", "idempotency#f");
        assert_eq!(
            single.key(&names, "f.op#k"),
            HashMap::from([
                ("id".into(), AttributeValue::S("idempotency#f".into())),
                ("sk".into(), AttributeValue::S("f.op#k".into())),
            ])
        );
        assert_eq!(single.expected(&names).to_string(), "(id HASH, sk RANGE)");
        assert_eq!(single.id_attribute(&names), "sk");
        assert_eq!(single.max_id_bytes(), 1024);
        assert_eq!(single.overhead_bytes(), "sk".len() + "idempotency#f".len());
    }

    #[test]
    fn a_key_of_another_type_is_named() {
        let mut schema = single_table("sk", "p").expected(&AttributeNames::default());
        schema.0[0].kind = "N".into();
        schema.0[1].kind = "B".into();
        assert_eq!(schema.to_string(), "(id HASH number, sk RANGE binary)");
    }

    #[test]
    fn settings_that_cannot_work_are_named() {
        let names = AttributeNames::default();
        assert_eq!(KeyLayout::new().problem(&names), None);
        assert_eq!(single_table("sk", "idempotency#f").problem(&names), None);
        let mut given = KeyLayout::new();
        given.partition_value_given = true;
        for (layout, says) in [
            (single_table("id", "p"), "same name \"id\""),
            (single_table("data", "p"), "same name \"data\""),
            (single_table("", "p"), "sort key attribute's name is empty"),
            (single_table("sk", ""), "partition key value is empty"),
            (single_table("sk", &"p".repeat(2049)), "2049 bytes"),
            (given, "but no sort key"),
        ] {
            let problem = layout.problem(&names).unwrap_or_default();
            assert!(problem.contains(says), "{layout:?}: {problem}");
        }
        let clash = AttributeNames {
            status: "data".into(),
            ..AttributeNames::default()
        };
        assert!(
            KeyLayout::new()
                .problem(&clash)
                .is_some_and(|p| p.contains("same name \"data\"")),
        );
    }

    #[test]
    fn the_default_partition_value_is_powertools() {
        assert!(default_partition_value().starts_with("idempotency#"));
    }
}
