"""stepwatch kernels: the reference MLA decode workload (`workload`, `bench`), the FP8 KV-cast
kernels (`kv_cast`), the SGLang patch (patches/) and the result bundle format (`bundle`, a
versioned contract between the side that runs and the side that imports).

May import: torch, triton and the standard library only, so that it runs on the GPU machine as is;
`bundle` and `names` import neither, and are what ingest/ and app/ may use from here.
"""
