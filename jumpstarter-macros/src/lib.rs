//! The `#[driver]` attribute macro: write a Jumpstarter driver as an ordinary `impl` block.
//!
//! Methods marked `#[export]` become callable with `DriverCall`, methods marked
//! `#[export(streaming)]` with `StreamingDriverCall`, and methods marked `#[export(stream)]`
//! with a `RouterService.Stream` driver request. Arguments and results are serde types,
//! converted through the one Value codec of `jumpstarter-core`. See the `Driver` trait of
//! `jumpstarter-core` for the full story and an example.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::{
    Attribute, Expr, ExprLit, FnArg, ImplItem, ImplItemFn, ItemImpl, Lit, Meta, Pat, Token, Type,
    parse::Parser, parse_macro_input, punctuated::Punctuated, spanned::Spanned,
};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Unary,
    Streaming,
    Stream,
}

struct Exported {
    name: syn::Ident,
    kind: Kind,
    takes_ctx: bool,
    args: Vec<Type>,
}

/// Turns an inherent `impl` block into an implementation of `jumpstarter_core::Driver`.
///
/// Attribute arguments: `client = "python.module.ClientClass"` (required, reported as the
/// `jumpstarter.dev/client` label); optionally `children = method_name` naming a
/// `fn(&self) -> Vec<(String, Arc<dyn Driver>)>` that lists built-in children, and
/// `session_end = method_name` naming an `async fn(&self)` run when a session serving the
/// driver ends (see `Driver::session_end`).
#[proc_macro_attribute]
pub fn driver(attr: TokenStream, item: TokenStream) -> TokenStream {
    let args = match Punctuated::<Meta, Token![,]>::parse_terminated.parse(attr) {
        Ok(a) => a,
        Err(e) => return e.to_compile_error().into(),
    };
    let mut item = parse_macro_input!(item as ItemImpl);
    match expand(args, &mut item) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// What `#[driver(...)]` says.
struct DriverArgs {
    /// `client = "python.module.ClientClass"`.
    client: syn::LitStr,
    /// `children = method`.
    children: Option<syn::Ident>,
    /// `session_end = method`.
    session_end: Option<syn::Ident>,
}

/// The match arms of the three dispatch methods, and the exported names.
#[derive(Default)]
struct Arms {
    unary: Vec<TokenStream2>,
    streaming: Vec<TokenStream2>,
    stream: Vec<TokenStream2>,
    names: Vec<String>,
}

fn expand(args: Punctuated<Meta, Token![,]>, item: &mut ItemImpl) -> syn::Result<TokenStream2> {
    let args = parse_args(args)?;
    let exported = take_exported(item)?;
    let type_name = type_name(&item.self_ty);
    let arms = dispatch_arms(&exported, &type_name);
    Ok(driver_impl(item, &args, &type_name, arms))
}

/// Reads the attribute's arguments; `client` is required.
fn parse_args(args: Punctuated<Meta, Token![,]>) -> syn::Result<DriverArgs> {
    let mut client: Option<syn::LitStr> = None;
    let mut children: Option<syn::Ident> = None;
    let mut session_end: Option<syn::Ident> = None;
    for meta in args {
        match meta {
            Meta::NameValue(nv) if nv.path.is_ident("client") => match nv.value {
                Expr::Lit(ExprLit {
                    lit: Lit::Str(s), ..
                }) => client = Some(s),
                other => return Err(syn::Error::new(other.span(), "expected a string literal")),
            },
            Meta::NameValue(nv) if nv.path.is_ident("children") => match nv.value {
                Expr::Path(p) if p.path.get_ident().is_some() => {
                    children = p.path.get_ident().cloned();
                }
                other => return Err(syn::Error::new(other.span(), "expected a method name")),
            },
            Meta::NameValue(nv) if nv.path.is_ident("session_end") => match nv.value {
                Expr::Path(p) if p.path.get_ident().is_some() => {
                    session_end = p.path.get_ident().cloned();
                }
                other => return Err(syn::Error::new(other.span(), "expected a method name")),
            },
            other => {
                return Err(syn::Error::new(
                    other.span(),
                    "unknown argument: expected `client = \"...\"`, `children = method` or `session_end = method`",
                ));
            }
        }
    }
    let client = client.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing `client = \"module.ClientClass\"`",
        )
    })?;
    Ok(DriverArgs {
        client,
        children,
        session_end,
    })
}

/// Removes the `#[export]` attributes of the impl block's methods, describing each method.
fn take_exported(item: &mut ItemImpl) -> syn::Result<Vec<Exported>> {
    let mut exported = Vec::new();
    for it in item.items.iter_mut() {
        if let ImplItem::Fn(f) = it
            && let Some(kind) = take_export_attr(&mut f.attrs)?
        {
            exported.push(describe(f, kind)?);
        }
    }
    Ok(exported)
}

/// The driver's type name as reported to clients: the last segment of the impl's type.
fn type_name(self_ty: &Type) -> String {
    match self_ty {
        Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        _ => "Driver".to_string(),
    }
}

/// One arm per exported method in each dispatch method: the call itself in the method of its
/// kind, a "wrong marker" error in the other two.
fn dispatch_arms(exported: &[Exported], type_name: &str) -> Arms {
    let core = quote!(::jumpstarter_core);
    let mut arms = Arms::default();
    let Arms {
        unary: unary_arms,
        streaming: streaming_arms,
        stream: stream_arms,
        names,
    } = &mut arms;
    for e in exported {
        let mname = e.name.to_string();
        let ident = &e.name;
        names.push(mname.clone());
        let nargs = e.args.len();
        let vars: Vec<_> = (0..nargs).map(|i| format_ident!("__a{}", i)).collect();
        let tys = &e.args;
        let decode = quote! {
            let mut __dec = #core::value::ArgDecoder::new(#type_name, #mname, __args, #nargs)?;
            #( let #vars: #tys = __dec.next_arg()?; )*
        };
        let ctx_arg = if e.takes_ctx {
            quote!(&__ctx,)
        } else {
            quote!()
        };
        let wrong = |marker: &str| {
            quote! { #mname => ::std::result::Result::Err(#core::DriverError::MissingMarker {
            method: __method.clone(), marker: #marker }), }
        };
        match e.kind {
            Kind::Unary => {
                unary_arms.push(quote! {
                    #mname => {
                        #decode
                        let __r = self.#ident(#ctx_arg #(#vars),*).await?;
                        #core::value::to_value(&__r).map_err(#core::DriverError::from)
                    }
                });
                streaming_arms.push(wrong("marker_streamingdrivercall"));
                stream_arms.push(wrong("marker_exportstream"));
            }
            Kind::Streaming => {
                streaming_arms.push(quote! {
                    #mname => {
                        #decode
                        let __s = self.#ident(#ctx_arg #(#vars),*).await?;
                        ::std::result::Result::Ok(#core::driver::encode_stream(__s))
                    }
                });
                unary_arms.push(wrong("marker_drivercall"));
                stream_arms.push(wrong("marker_exportstream"));
            }
            Kind::Stream => {
                stream_arms.push(quote! {
                    #mname => {
                        let __s = self.#ident(#ctx_arg).await?;
                        ::std::result::Result::Ok(::std::boxed::Box::new(__s) as #core::driver::BoxDuplex)
                    }
                });
                unary_arms.push(wrong("marker_drivercall"));
                streaming_arms.push(wrong("marker_streamingdrivercall"));
            }
        }
    }
    arms
}

/// The `Driver` impl: the item itself, then the trait's methods dispatching to it.
fn driver_impl(item: &ItemImpl, args: &DriverArgs, type_name: &str, arms: Arms) -> TokenStream2 {
    let core = quote!(::jumpstarter_core);
    let self_ty = &item.self_ty;
    let (impl_generics, _, where_clause) = item.generics.split_for_impl();
    let DriverArgs {
        client,
        children,
        session_end,
    } = args;
    let Arms {
        unary: unary_arms,
        streaming: streaming_arms,
        stream: stream_arms,
        names,
    } = arms;
    let children_fn = children.as_ref().map(|c| {
        quote! {
            fn children(&self) -> ::std::vec::Vec<(::std::string::String, ::std::sync::Arc<dyn #core::Driver>)> {
                self.#c()
            }
        }
    });

    let session_end_fn = session_end.as_ref().map(|m| {
        quote! {
            fn session_end(self: ::std::sync::Arc<Self>) -> #core::driver::BoxFuture<()> {
                ::std::boxed::Box::pin(async move { self.#m().await })
            }
        }
    });

    quote! {
        #item

        impl #impl_generics #core::Driver for #self_ty #where_clause {
            fn client_class(&self) -> ::std::string::String {
                ::std::string::String::from(#client)
            }

            fn type_name(&self) -> &'static str {
                #type_name
            }

            fn exported_methods(&self) -> &'static [&'static str] {
                &[#(#names),*]
            }

            #children_fn

            #session_end_fn

            fn call(
                self: ::std::sync::Arc<Self>,
                __ctx: #core::CallContext,
                __method: ::std::string::String,
                __args: ::std::vec::Vec<#core::value::Value>,
            ) -> #core::driver::BoxFuture<::std::result::Result<#core::value::Value, #core::DriverError>> {
                ::std::boxed::Box::pin(async move {
                    let _ = &__ctx;
                    match __method.as_str() {
                        #(#unary_arms)*
                        _ => ::std::result::Result::Err(#core::DriverError::MethodNotFound(__method.clone())),
                    }
                })
            }

            fn streaming_call(
                self: ::std::sync::Arc<Self>,
                __ctx: #core::CallContext,
                __method: ::std::string::String,
                __args: ::std::vec::Vec<#core::value::Value>,
            ) -> #core::driver::BoxFuture<::std::result::Result<#core::driver::ValueStream, #core::DriverError>> {
                ::std::boxed::Box::pin(async move {
                    let _ = &__ctx;
                    let _ = &__args;
                    match __method.as_str() {
                        #(#streaming_arms)*
                        _ => ::std::result::Result::Err(#core::DriverError::MethodNotFound(__method.clone())),
                    }
                })
            }

            fn open_stream(
                self: ::std::sync::Arc<Self>,
                __ctx: #core::CallContext,
                __method: ::std::string::String,
            ) -> #core::driver::BoxFuture<::std::result::Result<#core::driver::BoxDuplex, #core::DriverError>> {
                ::std::boxed::Box::pin(async move {
                    let _ = &__ctx;
                    match __method.as_str() {
                        #(#stream_arms)*
                        _ => ::std::result::Result::Err(#core::DriverError::MethodNotFound(__method.clone())),
                    }
                })
            }
        }
    }
}

fn take_export_attr(attrs: &mut Vec<Attribute>) -> syn::Result<Option<Kind>> {
    let Some(pos) = attrs.iter().position(|a| a.path().is_ident("export")) else {
        return Ok(None);
    };
    let attr = attrs.remove(pos);
    let kind = match &attr.meta {
        Meta::Path(_) => Kind::Unary,
        Meta::List(list) => {
            let ident: syn::Ident = list.parse_args()?;
            match ident.to_string().as_str() {
                "streaming" => Kind::Streaming,
                "stream" => Kind::Stream,
                _ => {
                    return Err(syn::Error::new(
                        ident.span(),
                        "expected `#[export]`, `#[export(streaming)]` or `#[export(stream)]`",
                    ));
                }
            }
        }
        Meta::NameValue(nv) => {
            return Err(syn::Error::new(nv.span(), "unexpected `=` in #[export]"));
        }
    };
    Ok(Some(kind))
}

fn is_context(ty: &Type) -> bool {
    let ty = match ty {
        Type::Reference(r) => &*r.elem,
        other => other,
    };
    matches!(ty, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "CallContext"))
}

fn describe(f: &ImplItemFn, kind: Kind) -> syn::Result<Exported> {
    if f.sig.asyncness.is_none() {
        return Err(syn::Error::new(
            f.sig.span(),
            "exported driver methods must be `async fn`",
        ));
    }
    let mut inputs = f.sig.inputs.iter();
    match inputs.next() {
        Some(FnArg::Receiver(r)) if r.reference.is_some() && r.mutability.is_none() => {}
        _ => {
            return Err(syn::Error::new(
                f.sig.span(),
                "exported driver methods take `&self` first",
            ));
        }
    }
    let mut takes_ctx = false;
    let mut args = Vec::new();
    for (i, input) in inputs.enumerate() {
        let FnArg::Typed(pt) = input else {
            return Err(syn::Error::new(input.span(), "unexpected receiver"));
        };
        if i == 0 && is_context(&pt.ty) {
            if !matches!(&*pt.ty, Type::Reference(_)) {
                return Err(syn::Error::new(
                    pt.ty.span(),
                    "take the context as `&CallContext`",
                ));
            }
            takes_ctx = true;
            continue;
        }
        if !matches!(&*pt.pat, Pat::Ident(_) | Pat::Wild(_)) {
            return Err(syn::Error::new(pt.pat.span(), "use a plain argument name"));
        }
        args.push((*pt.ty).clone());
    }
    if kind == Kind::Stream && !args.is_empty() {
        return Err(syn::Error::new(
            f.sig.span(),
            "#[export(stream)] methods take no arguments besides the context",
        ));
    }
    Ok(Exported {
        name: f.sig.ident.clone(),
        kind,
        takes_ctx,
        args,
    })
}
