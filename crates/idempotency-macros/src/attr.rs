//! Parses the arguments of `#[idempotent(...)]`.

use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprPath, Ident, LitStr, Path, Token, bracketed, token};

/// The parsed arguments. Each is set at most once.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) handle: Option<Expr>,
    pub(crate) payload: Option<Ident>,
    pub(crate) context: Option<Ident>,
    pub(crate) key: Option<LitStr>,
    pub(crate) hash: Option<Fields>,
    pub(crate) validate: Option<Fields>,
    pub(crate) operation: Option<LitStr>,
    pub(crate) key_prefix: Option<LitStr>,
    /// The `with_outcome` flag itself, for its span.
    pub(crate) with_outcome: Option<Ident>,
    /// The `refused_writes_retryable` flag itself.
    pub(crate) refused_writes_retryable: Option<Ident>,
    /// `crate = "path"`: the path of `lambda_idempotency` in the caller's crate.
    pub(crate) krate: Option<Path>,
}

/// The field names of `hash` or `validate`.
pub(crate) enum Fields {
    /// `["a", "/b/c"]`: field names or JSON pointers, written out.
    List(Vec<LitStr>),
    /// `Type::FIELDS`: a constant holding them (`[&str; N]`, `&[&str]`, ...).
    Const(ExprPath),
}

const KNOWN: &str = "handle, payload, context, key, hash, validate, operation, key_prefix, with_outcome, refused_writes_retryable, crate";

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            // `parse_any`: `crate` is a keyword.
            let name = input.call(Ident::parse_any)?;
            let duplicate = || syn::Error::new(name.span(), format!("duplicate argument `{name}`"));
            if name == "with_outcome" || name == "refused_writes_retryable" {
                if input.peek(Token![=]) {
                    return Err(syn::Error::new(
                        name.span(),
                        format!("`{name}` takes no value: write `{name}` alone"),
                    ));
                }
                let flag = if name == "with_outcome" {
                    &mut args.with_outcome
                } else {
                    &mut args.refused_writes_retryable
                };
                set(flag, name.clone(), duplicate)?;
            } else {
                input.parse::<Token![=]>()?;
                match name.to_string().as_str() {
                    "handle" => set(&mut args.handle, input.parse()?, duplicate)?,
                    "payload" => set(&mut args.payload, input.parse()?, duplicate)?,
                    "context" => set(&mut args.context, input.parse()?, duplicate)?,
                    "key" => set(&mut args.key, key(input.parse()?)?, duplicate)?,
                    "hash" => set(&mut args.hash, input.parse()?, duplicate)?,
                    "validate" => set(&mut args.validate, input.parse()?, duplicate)?,
                    "operation" => {
                        set(&mut args.operation, id_part(input.parse()?)?, duplicate)?;
                    }
                    "key_prefix" => {
                        set(&mut args.key_prefix, id_part(input.parse()?)?, duplicate)?;
                    }
                    "crate" => set(&mut args.krate, crate_path(input)?, duplicate)?,
                    _ => {
                        return Err(syn::Error::new(
                            name.span(),
                            format!("unknown argument `{name}`; expected one of: {KNOWN}"),
                        ));
                    }
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

impl Parse for Fields {
    /// `["a", "/b/c"]`, or a path to a constant.
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.peek(token::Bracket) {
            let content;
            let brackets = bracketed!(content in input);
            let items: Punctuated<LitStr, Token![,]> =
                content.parse_terminated(|p| p.parse(), Token![,])?;
            if items.is_empty() {
                return Err(syn::Error::new(
                    brackets.span.join(),
                    "list at least one field",
                ));
            }
            return Ok(Fields::List(
                items
                    .into_iter()
                    .map(|lit| non_empty(lit).and_then(field))
                    .collect::<syn::Result<_>>()?,
            ));
        }
        let not_fields = |span| {
            syn::Error::new(
                span,
                "expected a list of fields, `[\"field\", ...]`, or the path of a constant holding them, `Type::FIELDS`",
            )
        };
        match input.parse::<Expr>() {
            Ok(Expr::Path(path)) => Ok(Fields::Const(path)),
            Ok(other) => Err(not_fields(other.span())),
            Err(err) => Err(not_fields(err.span())),
        }
    }
}

/// `crate = "path"`, as serde and `#[tokio::main]` spell it.
fn crate_path(input: ParseStream<'_>) -> syn::Result<Path> {
    let expected = |span| {
        syn::Error::new(
            span,
            "expected the path of `lambda_idempotency` as a string: `crate = \"my_idempotency\"`",
        )
    };
    let lit: LitStr = input.parse().map_err(|err| expected(err.span()))?;
    lit.parse().map_err(|_| expected(lit.span()))
}

fn set<T>(slot: &mut Option<T>, value: T, duplicate: impl Fn() -> syn::Error) -> syn::Result<()> {
    if slot.is_some() {
        return Err(duplicate());
    }
    *slot = Some(value);
    Ok(())
}

/// An `operation` or `key_prefix`: a `#` would end the stored id's prefix early, so two
/// operations could share ids (the runtime refuses it too; here it is a compile error).
fn id_part(lit: LitStr) -> syn::Result<LitStr> {
    let lit = non_empty(lit)?;
    if lit.value().contains('#') {
        return Err(syn::Error::new(
            lit.span(),
            "must not contain `#`, which ends the prefix of a stored id (`{prefix}#{key}`)",
        ));
    }
    Ok(lit)
}

/// `key = "..."`: a field name, or a JSON pointer when it starts with `/`.
fn key(lit: LitStr) -> syn::Result<LitStr> {
    field(non_empty(lit)?)
}

/// A field name or a JSON pointer: a pointer's `~` must start `~0` or `~1` (RFC 6901). A
/// name with a `/` that does not start with one (`"order/id"`) would be a top-level field
/// literally named so, which is almost never what is meant: refused, naming both spellings.
fn field(lit: LitStr) -> syn::Result<LitStr> {
    let value = lit.value();
    if !value.starts_with('/') && value.contains('/') {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "{value:?} is neither a field name nor a JSON pointer: for the nested field write \"/{}\" (a JSON pointer starts with `/`); for a top-level field whose name holds `/`, write \"/{}\"",
                value.replace('~', "~0"),
                value.replace('~', "~0").replace('/', "~1")
            ),
        ));
    }
    if value.starts_with('/') {
        let mut chars = value.chars();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return Err(syn::Error::new(
                    lit.span(),
                    "invalid JSON pointer: `~` must be followed by `0` (for `~`) or `1` (for `/`)",
                ));
            }
        }
    }
    Ok(lit)
}

fn non_empty(lit: LitStr) -> syn::Result<LitStr> {
    if lit.value().is_empty() {
        return Err(syn::Error::new(lit.span(), "must not be empty"));
    }
    Ok(lit)
}
