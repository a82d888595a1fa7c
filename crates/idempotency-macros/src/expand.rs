//! Generates the idempotent function.

use crate::attr::Args;
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Type};

pub(crate) fn expand(args: Args, function: ItemFn) -> syn::Result<TokenStream> {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span,
            "`#[idempotent]` needs an `async fn`: the claim and the stored result are store requests",
        ));
    }
    let output = match &sig.output {
        ReturnType::Type(_, ty) if is_result(ty) => ty.clone(),
        ReturnType::Type(_, ty) => {
            return Err(syn::Error::new(
                ty.span(),
                "`#[idempotent]` needs a `Result<T, E>` return type: `T` is stored and replayed, `E` carries `lambda_idempotency::Error`",
            ));
        }
        ReturnType::Default => {
            return Err(syn::Error::new(
                sig.ident.span(),
                "`#[idempotent]` needs a `Result<T, E>` return type: `T` is stored and replayed, `E` carries `lambda_idempotency::Error`",
            ));
        }
    };
    let handle = args.handle.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing `handle = ...`: an expression giving the `lambda_idempotency::Idempotency` to use (a static, a field, an argument)",
        )
    })?;
    if args.key.is_none() && args.hash.is_none() {
        return Err(syn::Error::new(
            Span::call_site(),
            "missing key: add `key = \"request_id\"` (a field or a JSON pointer) or `hash = [\"field\", ...]` (a hash of those fields)",
        ));
    }
    let params: Vec<&Ident> = sig
        .inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(pt) => match &*pt.pat {
                Pat::Ident(pi) => Some(&pi.ident),
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
        .collect();
    let payload = match &args.payload {
        Some(name) => {
            if !params.contains(&name) {
                return Err(syn::Error::new(
                    name.span(),
                    format!("`payload = {name}` names no argument of this function"),
                ));
            }
            name.clone()
        }
        None => {
            let candidates: Vec<&&Ident> = params
                .iter()
                .filter(|p| args.context.as_ref() != Some(**p))
                .collect();
            match candidates.as_slice() {
                [only] => (**only).clone(),
                _ => {
                    return Err(syn::Error::new(
                        sig.ident.span(),
                        "say which argument is the payload: `payload = <argument>` (the key is read from it)",
                    ));
                }
            }
        }
    };
    if let Some(ctx) = &args.context
        && !params.contains(&ctx)
    {
        return Err(syn::Error::new(
            ctx.span(),
            format!("`context = {ctx}` names no argument of this function"),
        ));
    }

    // The default is the function's full path (module, type for methods, name), read at
    // run time from the path of an item declared in the body: a proc macro sees neither
    // the module nor the enclosing `impl`. The body of an `async fn` (or of a closure or
    // async block the function is declared in) adds `{{closure}}` parts, which are
    // dropped; `#` (a `char` const argument) would end the operation part of stored ids.
    let (marker, name) = match &args.operation {
        Some(name) => (quote! {}, quote! { #name }),
        None => (
            quote! { fn __idempotent_marker() {} },
            quote! {
                &{
                    let path = ::core::any::type_name_of_val(&__idempotent_marker);
                    let path = path.strip_suffix("::__idempotent_marker").unwrap_or(path);
                    path.replace("::{{closure}}", "").replace('#', "%23")
                }
            },
        ),
    };
    let key = option_lit(args.key.as_ref());
    let hash = option_list(args.hash.as_deref());
    let validate = option_list(args.validate.as_deref());
    let key_prefix = option_lit(args.key_prefix.as_ref());
    let deadline = match &args.context {
        Some(ctx) => quote! {
            ::lambda_idempotency::__macro_support::context_deadline(::core::borrow::Borrow::<::lambda_idempotency::__macro_support::Context>::borrow(&#ctx))
        },
        None => quote! { ::core::option::Option::None },
    };
    // Spanned at the payload argument and the return type, so a payload that does not
    // serialize, or a result that cannot be stored, is reported there, once.
    let payload_json = quote_spanned! {payload.span()=>
        ::lambda_idempotency::__macro_support::payload(&#payload)
    };
    let run = quote_spanned! {output.span()=>
        ::lambda_idempotency::__macro_support::run(
            &__idempotent_handle,
            __idempotent_operation,
            __idempotent_payload,
            __idempotent_deadline,
            __idempotent_body,
        )
        .await
    };

    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #marker
            static __IDEMPOTENT_OPERATION: ::std::sync::OnceLock<::lambda_idempotency::Operation> =
                ::std::sync::OnceLock::new();
            let __idempotent_operation = __IDEMPOTENT_OPERATION.get_or_init(|| {
                ::lambda_idempotency::__macro_support::operation(#name, #key, #hash, #validate, #key_prefix)
            });
            let __idempotent_handle: ::lambda_idempotency::Idempotency =
                ::lambda_idempotency::Idempotency::clone(&(#handle));
            let __idempotent_payload = #payload_json;
            let __idempotent_deadline = #deadline;
            let __idempotent_body = move || async move {
                // Pins the block's type to the declared return type, for `?` and `return`.
                #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::needless_return)]
                if false {
                    let __idempotent_fake_return: #output = loop {};
                    return __idempotent_fake_return;
                }
                #block
            };
            #run
        }
    })
}

fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Result"),
        Type::Paren(p) => is_result(&p.elem),
        Type::Group(g) => is_result(&g.elem),
        _ => false,
    }
}

fn option_lit(lit: Option<&LitStr>) -> TokenStream {
    match lit {
        Some(lit) => quote! { ::core::option::Option::Some(#lit) },
        None => quote! { ::core::option::Option::None },
    }
}

fn option_list(list: Option<&[LitStr]>) -> TokenStream {
    match list {
        Some(items) => quote! { ::core::option::Option::Some(&[#(#items),*]) },
        None => quote! { ::core::option::Option::None },
    }
}
