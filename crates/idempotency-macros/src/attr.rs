//! Parses the arguments of `#[idempotent(...)]`.

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, LitStr, Token, bracketed};

/// The parsed arguments. Each is set at most once.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) handle: Option<Expr>,
    pub(crate) payload: Option<Ident>,
    pub(crate) context: Option<Ident>,
    pub(crate) key: Option<LitStr>,
    pub(crate) hash: Option<Vec<LitStr>>,
    pub(crate) validate: Option<Vec<LitStr>>,
    pub(crate) operation: Option<LitStr>,
    pub(crate) key_prefix: Option<LitStr>,
}

const KNOWN: &str = "handle, payload, context, key, hash, validate, operation, key_prefix";

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let name: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            let duplicate = || syn::Error::new(name.span(), format!("duplicate argument `{name}`"));
            match name.to_string().as_str() {
                "handle" => set(&mut args.handle, input.parse()?, duplicate)?,
                "payload" => set(&mut args.payload, input.parse()?, duplicate)?,
                "context" => set(&mut args.context, input.parse()?, duplicate)?,
                "key" => set(&mut args.key, non_empty(input.parse()?)?, duplicate)?,
                "hash" => set(&mut args.hash, list(input)?, duplicate)?,
                "validate" => set(&mut args.validate, list(input)?, duplicate)?,
                "operation" => set(&mut args.operation, non_empty(input.parse()?)?, duplicate)?,
                "key_prefix" => set(&mut args.key_prefix, non_empty(input.parse()?)?, duplicate)?,
                _ => {
                    return Err(syn::Error::new(
                        name.span(),
                        format!("unknown argument `{name}`; expected one of: {KNOWN}"),
                    ));
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

fn set<T>(slot: &mut Option<T>, value: T, duplicate: impl Fn() -> syn::Error) -> syn::Result<()> {
    if slot.is_some() {
        return Err(duplicate());
    }
    *slot = Some(value);
    Ok(())
}

fn non_empty(lit: LitStr) -> syn::Result<LitStr> {
    if lit.value().is_empty() {
        return Err(syn::Error::new(lit.span(), "must not be empty"));
    }
    Ok(lit)
}

/// `["a", "/b/c"]`: field names or JSON pointers.
fn list(input: ParseStream<'_>) -> syn::Result<Vec<LitStr>> {
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
    items.into_iter().map(non_empty).collect()
}
