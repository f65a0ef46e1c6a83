"""Dynamic sampling filters: `fn(args, samples_of_one_group, **kw) -> DynamicFilterOutput | bool`."""
