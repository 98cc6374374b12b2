"""Category rules on real kernel names: those in the H200 captures of tests/data/bundles, and
names printed in public SGLang / vLLM / InferenceX / Hugging Face profiles (cited per row)."""

import pytest

from ingest.traces.categories import RulesError, categorise, load_rule_chain, load_rules

RULES = load_rule_chain()

# (kernel name, launcher, activity, dtypes differ) -> category
OURS = [  # tests/data/bundles and the glm5 eager captures, torch 2.11 on the H200
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}, "
     "std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>,"
     " at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >", "cudaGraphLaunch", "kernel",
     False, "cast"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::float8_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >", "cudaGraphLaunch", "kernel", False, "cast"),
    ("_gather_cast_kernel", "cuLaunchKernelEx", "kernel", False, "cast"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "aten::mm", "kernel", False, "gemm"),
    ("void cutlass::Kernel2<cutlass_75_tensorop_s1688gemm_bf16_64x64_nn_align1>(cutlass_75_tensorop_s1688gemm_bf16_"
     "64x64_nn_align1::Params)", "aten::bmm", "kernel", False, "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, "
     "__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, true, false, false, false>", "aten::bmm", "kernel", False, "gemm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int, float, "
     "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
     "aten::_fused_rms_norm", "kernel", False, "norm"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<c10::BFloat16, float, c10::BFloat16, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue, long, 3>", "aten::_softmax", "kernel", False,
     "attention"),
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
     "aten::index", "kernel", False, "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
     "std::array<char*, 3ul> >", "aten::add", "kernel", False, "elementwise"),
]
PUBLIC = [
    # sglang PR #22440 (torch-profiler-analysis skill), kernel table
    ("nvjet_tst_512x8_64x3_2x1_v_bz_TNT", "aten::mm", "kernel", False, "gemm"),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu", "cuLaunchKernelEx", "kernel", False, "moe"),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90"
     "<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >", "", "kernel", False, "attention"),
    # SemiAnalysisAI/InferenceX issue #1005 (DeepSeek-R1 on MI355X, SGLang)
    ("cross_device_reduce_2stage<bf16, 4>", "", "kernel", False, "communication"),
    ("ck::moe_mxgemm", "", "kernel", False, "moe"),
    # deepseek-ai/profile-data (train.json, prefill.json): DeepEP's internode all-to-all as DeepSeek builds it
    ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(...)", "", "kernel", False, "communication"),
    ("void dpsk::ep::internode::combine<...>", "", "kernel", False, "communication"),
    ("void dpsk::ep::internode::notify_dispatch<false, 4>(int const*, long*, int, int const*, int*, int const*, int*, "
     "int, bool const*, int, int, int, int, int, int, int, ...)", "", "kernel", False, "communication"),
    # vllm-project/vllm PR #6317 (nsys kernel summary)
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIterator…", "", "kernel",
     False, "memcpy"),
    ("void at::native::<unnamed>::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, (int)2, (int)2…", "", "kernel",
     False, "elementwise"),
    ("void at_cuda_detail::cub::DeviceSegmentedRadixSortKernel<at_cuda_detail::cub::DeviceRadixSortPolicy…", "",
     "kernel", False, "other"),
    # huggingface/blog PR #3408 (torch.compile fusion)
    ("triton_poi_fused__unsafe_view_gelu_mul_0", "", "kernel", False, "elementwise"),
    # NCCL's device kernels and CUPTI's memcpy / memset activities
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "c10d::allreduce_", "kernel",
     False, "communication"),
    ("Memcpy DtoD (Device -> Device)", "aten::copy_", "memcpy", False, "memcpy"),
    ("Memset (Device)", "aten::zero_", "memset", False, "memcpy"),
    # AMD TraceLens, tests/traces/inference/xdit_*/profile_trace_rank_0 (MI300X, torch.compile): SageAttention,
    # and inductor fusions named after the ops they fused (a pointwise transpose, an RMSNorm after a matmul)
    ("sage_fwd", "", "kernel", False, "attention"),
    ("sage_quant_kernel", "", "kernel", False, "attention"),
    ("triton_poi_fused__scaled_dot_product_flash_attention_cat_transpose_view_10", "", "kernel", False, "elementwise"),
    ("triton_per_fused__to_copy_add_addmm_mean_mul_pow_rsqrt_transpose_view_9", "", "kernel", False, "norm"),
    # a float -> bf16 copy replayed from a CUDA graph (no op to tell its dtypes): a cast by its name
    # (torch 2.11 on the H200, captured here)
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda(float)#1}, std::array<char*, 2ul>)", "cudaGraphLaunch", "kernel", False, "cast"),
    # ResNet-50 training on a V100, torch 1.9 (pytorch/kineto be239c0, tb_plugin/samples/resnet50_*): cuDNN's
    # convolutions (implicit GEMMs, forward and backward) and batch norm, 63 % of its kernel time once "other"
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int, float "
     "const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, int, int, "
     "int)", "aten::cudnn_convolution_backward_input", "kernel", False, "gemm"),
    ("void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float const"
     "*, int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int"
     ")",
     "aten::cudnn_convolution_backward_weight", "kernel", False, "gemm"),
    ("void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(int, int, int, float "
     "const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, float const*,"
     " float const*, bool, int, int)", "aten::cudnn_convolution", "kernel", False, "gemm"),
    ("volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "aten::cudnn_convolution", "kernel", False,
     "gemm"),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float, float, float, "
     "cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, "
     "float*, float*, float const*, float const*, float)", "aten::cudnn_batch_norm_backward", "kernel", False,
     "norm"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>(cudnnTensorStruct, float const*, "
     "cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, "
     "float)", "aten::cudnn_batch_norm", "kernel", False, "norm"),
]
CPU_OPS = [  # CPU-only traces: CPU ops stand for kernels (tests/data/traces/cpu_small.trace.json)
    ("aten::copy_", "aten::copy_", "cpu_op", True, "cast"),
    ("aten::copy_", "aten::copy_", "cpu_op", False, "memcpy"),
    ("aten::mm", "aten::mm", "cpu_op", False, "gemm"),
    ("aten::sum", "aten::sum", "cpu_op", False, "elementwise"),
    ("aten::empty", "aten::empty", "cpu_op", False, "other"),
]


@pytest.mark.parametrize("name,launcher,activity,mixed,expected", OURS + PUBLIC + CPU_OPS)
def test_real_names(name, launcher, activity, mixed, expected):
    assert categorise(RULES, name, launcher, activity, mixed) == expected


def test_a_copy_kernel_is_a_cast_when_its_op_converts_dtypes():
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::direct_copy_kernel_cuda(...)>"
    assert categorise(RULES, name, "aten::copy_", "kernel", True) == "cast"
    assert categorise(RULES, name, "aten::copy_", "kernel", False) == "memcpy"


def test_every_built_in_category_is_reachable():
    seen = {row[-1] for row in OURS + PUBLIC + CPU_OPS}
    assert seen == {"cast", "memcpy", "gemm", "attention", "moe", "communication", "norm", "elementwise", "other"}


def test_user_rules_come_first(tmp_path):
    rules = tmp_path / "mine.toml"
    rules.write_text('[[rule]]\ncategory = "kv-fetch"\nname = "gather_cast"\n')
    chain = load_rule_chain(rules)
    assert categorise(chain, "_gather_cast_kernel") == "kv-fetch"
    assert categorise(chain, "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT") == "gemm"


@pytest.mark.parametrize("body,message", [
    ("not toml [", "not valid TOML"),
    ("[other]\nx = 1\n", "no [[rule]] tables"),
    ('[[rule]]\ncategory = "x"\nname = "("\n', "rule 1 field 'name' is not a valid regex"),
    ('[[rule]]\ncategory = "x"\ncolour = "red"\n', "rule 1 has unknown field(s) colour"),
    ('[[rule]]\ncategory = "Bad Name"\n', "rule 1 field 'category'"),
    ('[[rule]]\ncategory = "x"\nactivity = ["gpu"]\n', "rule 1 field 'activity'"),
    ('[[rule]]\ncategory = "x"\ndtypes_differ = "yes"\n', "rule 1 field 'dtypes_differ'"),
])
def test_bad_rules_files_are_refused_with_the_reason(tmp_path, body, message):
    path = tmp_path / "rules.toml"
    path.write_text(body)
    with pytest.raises(RulesError) as err:
        load_rules(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value)
