---@meta
-- The analysis document as Lua reads it: LuaLS annotations (`---@class`), never required. The
-- fields and their meaning are docs/analysis-document.md's (the engine writes them in
-- skyline_engine/analysis/document.py, `AnalysisDocument.to_dict()`). The remote plugin drops null
-- fields before Lua sees them, so a field the document says "or null" is optional (`?`) here and
-- reads as nil; so is one absent from documents written before it was added.
-- tests/test_lua_document.py keeps these classes and the doc's tables the same.

---@class skyline.AnalysisDocument
---@field schema string `"skyline.analysis/1"`
---@field engine_version string
---@field torch_version string
---@field project_root string absolute path of the project root
---@field entry_point string relative to the project root
---@field device skyline.Device
---@field batch_size integer the batch size analysed
---@field iteration skyline.Measurement the measurement at `batch_size`
---@field models skyline.Models? nil in a partial document, or when withheld (`models_withheld`)
---@field models_withheld string? why a complete document has no `models`
---@field predictions skyline.Prediction[] at a ladder of batch sizes (empty without models)
---@field batch_size_location skyline.BatchSizeLocation?
---@field warnings string[]
---@field distributed skyline.Distributed? data-parallel training; nil for one process
---@field compilation skyline.Compilation? what torch.compile compiled; nil when nothing was
---@field memory_growth skyline.MemoryGrowth? memory each iteration keeps for good
---@field runtime_changes string[] what the engine changed in the process's runtime (--settle-runtime)
---@field reused skyline.Reused? what was taken from the previous analysis of the same code
---@field lines skyline.SourceLine[] the per-line breakdown, by path then line
---@field operations skyline.OperationNode the module and operation tree (root: `iteration`)
---@field weights skyline.Weight[]
---@field optimizer_state skyline.OptimizerState[]
---@field untracked skyline.Untracked
---@field peak_memory_operation skyline.PeakMemoryOperation? where the recorded iteration's memory peaked
---@field peak_memory_parts skyline.PeakMemoryParts? what is alive at the peak; absent from older documents
---@field attribution skyline.Attribution
---@field timeline skyline.TimelineEntry[]? only when asked for (`--trace`)

---@class skyline.Device
---@field type string `"cpu"` or `"cuda"`
---@field index integer? the CUDA device index
---@field name string
---@field memory_capacity_bytes integer what the predictions plan for
---@field memory_capacity_source string `"user"`, `"cuda"`, `"nvml"`, `"system_available"`, …

--- One batch size as measured: `iteration`, `models.samples[]`, `predictions[].measured`.
---@class skyline.Measurement
---@field batch_size integer
---@field run_time_ms number one training iteration
---@field run_time_iqr_ms number
---@field repetitions integer
---@field samples_per_second number
---@field micro_batches integer? gradient accumulation (1 without); absent from older documents
---@field peak_memory_bytes integer
---@field peak_memory_phase string `"forward_backward"`, `"optimizer"` or `"other"`
---@field peak_memory_reserved_bytes integer? CUDA: the caching allocator's peak; nil on the CPU
---@field page_faults_per_iteration number? minor page faults while timed; nil where not timed

---@class skyline.Reused
---@field memory_batch_sizes integer[] whose memory was taken, not measured again
---@field memory_growth_check_skipped boolean
---@field reason string in a sentence

---@class skyline.MemoryGrowth
---@field bytes_per_iteration integer
---@field lines skyline.GrowthLine[] up to three, largest first

---@class skyline.GrowthLine
---@field path string? nil for operations at no line of the project
---@field line integer?
---@field bytes integer

---@class skyline.Models
---@field samples skyline.Measurement[] every batch size timed for the models
---@field memory_samples skyline.MemorySample[] batch sizes whose memory alone was measured
---@field checks skyline.Measurement[] timed beside the user's after the models were fitted
---@field recommendation skyline.Recommendation the batch size to use, or none and why
---@field run_time_ms skyline.FittedLine `slope * batch_size + bias`
---@field peak_memory_bytes skyline.PeakMemoryModel
---@field memory_headroom_fraction number
---@field micro_batches integer
---@field samples_per_step integer? fixed samples per optimizer step, where accumulation varies
---@field usable_memory_bytes integer
---@field max_batch_size integer? the largest batch size predicted to fit
---@field max_batch_size_extrapolated boolean
---@field trusted_range integer[] `{low, high}`
---@field failing_batch_sizes integer[]? where the user's code failed; absent from older documents
---@field line_bends_at integer? a probe past the timed batch sizes ran off the line (below or above): the range ends before it
---@field range_unprobed boolean? no probe past the timed batch sizes fit the budget, or it spread too much: the range ends at them
---@field range_probed_to integer? the probe held to the line short of the range's end: the range ends at it
---@field throughput_knee_batch_size integer?
---@field throughput_knee_samples_per_second number?
---@field best_batch_size integer?
---@field predicted_max_samples_per_second number?
---@field asymptotic_samples_per_second number?

--- `models.recommendation`: one answer, measured, or none (`batch_size` nil) and why.
---@class skyline.Recommendation
---@field batch_size integer? nil when no change is worth making
---@field samples_per_second number? measured at `batch_size`
---@field measured boolean
---@field reason string clauses separated by `; `
---@field users_samples_per_second number? the user's batch size, timed in the same rounds
---@field timed string? how the two were compared: `timed beside it`, or a script's `timed in runs before and after it`

--- A least-squares line: `models.run_time_ms` (and the base of `models.peak_memory_bytes`).
---@class skyline.FittedLine
---@field slope number per sample: milliseconds, or bytes
---@field bias number
---@field r2 number? nil with two points
---@field max_relative_residual number
---@field points integer

---@class skyline.PeakMemoryModel: skyline.FittedLine
---@field quadratic number bytes per sample squared (0 for a line)
---@field phases skyline.PeakMemoryCurve[] the curves whose maximum is the predicted peak
---@field fitted string `"per_operation"` or `"per_phase"`
---@field phase_at_max_batch_size string?

---@class skyline.PeakMemoryCurve
---@field name string the phase
---@field slope number
---@field bias number
---@field r2 number?
---@field quadratic number? absent from older documents (read it as 0)

---@class skyline.MemorySample
---@field batch_size integer
---@field peak_memory_bytes integer
---@field peak_memory_phase string

---@class skyline.Prediction
---@field batch_size integer
---@field run_time_ms number? nil where the line predicts no time
---@field samples_per_second number? nil with `run_time_ms`
---@field peak_memory_bytes number
---@field fits boolean
---@field extrapolated boolean outside `models.trusted_range`
---@field measured skyline.Measurement? a measured batch size's measurement (`samples`, else `checks`)

---@class skyline.BatchSizeLocation
---@field path string
---@field line integer
---@field col_start integer byte offset
---@field col_end integer
---@field editable boolean
---@field value integer?
---@field reason string? why it is not editable

---@class skyline.Compilation
---@field graphs integer
---@field seconds number
---@field batch_sizes skyline.CompiledBatchSize[]
---@field peak_memory string `"compiled_program"` (CUDA: the program's own) or `"eager_replay"`

---@class skyline.CompiledBatchSize
---@field batch_size integer
---@field graphs integer
---@field seconds number

---@class skyline.TimelineEntry
---@field name string
---@field phase string `"forward"`, `"backward"` or `"optimizer"`
---@field start_ms number
---@field duration_ms number
---@field path string?
---@field line integer?
---@field module string
---@field span_ms number? CUDA with kernel times: the operation's span on the stream

---@class skyline.Distributed
---@field world_size integer
---@field backend string `"gloo"` or `"nccl"`
---@field threads_per_rank integer
---@field ranks skyline.Rank[]
---@field slowest_rank integer
---@field buckets skyline.Bucket[]
---@field communication skyline.Communication
---@field link skyline.Link?
---@field scaling skyline.Scaling[] empty without `link`

---@class skyline.Rank
---@field rank integer
---@field run_time_ms number with the all-reduces
---@field compute_ms number without communication
---@field peak_memory_bytes integer

---@class skyline.Bucket
---@field index integer
---@field size_bytes integer
---@field parameters string[]
---@field ready_ms number
---@field all_reduce_ms number
---@field exposed_ms number
---@field lines skyline.Frame[]

---@class skyline.Communication
---@field all_reduce_ms number
---@field exposed_ms number what communication adds to the iteration
---@field compute_ms number
---@field backward_end_ms number

---@class skyline.Link
---@field description string
---@field source string `"measured"` or `"user"`
---@field latency_us number
---@field bandwidth_gbps number

---@class skyline.Scaling
---@field world_size integer
---@field samples_per_second number
---@field iteration_ms number
---@field exposed_ms number
---@field extrapolated boolean
---@field measured_samples_per_second number? at the measured world size

--- A line of the project: `lines[]`.
---@class skyline.SourceLine
---@field path string
---@field line integer
---@field forward_ms number
---@field backward_ms number
---@field step_ms number
---@field memory_bytes integer
---@field invocations integer
---@field inclusive skyline.Inclusive
---@field communication_ms number? data-parallel training; nil for one process

--- `lines[].inclusive`: everything beneath the line.
---@class skyline.Inclusive
---@field forward_ms number
---@field backward_ms number
---@field step_ms number

--- A node of `operations`: a module, or an operation at one stack of the project's frames.
---@class skyline.OperationNode
---@field name string
---@field kind string `"module"` or `"operation"`
---@field module string
---@field forward_ms number
---@field backward_ms number
---@field step_ms number
---@field activation_bytes integer
---@field contexts skyline.Frame[] a module's callers; an operation's frames, innermost first
---@field children skyline.OperationNode[]

---@class skyline.Weight
---@field name string
---@field size_bytes integer
---@field grad_size_bytes integer
---@field contexts skyline.Frame[]

---@class skyline.OptimizerState
---@field name string
---@field size_bytes integer
---@field contexts skyline.Frame[]

--- A line of the project: `operations.contexts[]`, `weights[].contexts[]`, …
---@class skyline.Frame
---@field path string relative to the project root
---@field line integer 1-based

---@class skyline.Untracked
---@field run_time_ms number
---@field memory_bytes integer
---@field workspace_bytes integer? CUDA's cuBLAS workspaces; absent from older documents

---@class skyline.PeakMemoryOperation
---@field operation string
---@field phase string `"forward"`, `"backward"` or `"optimizer"`
---@field path string? nil when no line of the project is on its stack
---@field line integer?
---@field other_tensors skyline.PeakTenant[]? the other tensors alive right after it

---@class skyline.PeakTenant
---@field path string
---@field line integer
---@field phase string `"forward"`, `"backward"` or `"optimizer"`
---@field bytes integer

--- What is alive at the memory peak, in parts that add up to it.
---@class skyline.PeakMemoryParts
---@field weights_bytes integer
---@field gradients_bytes integer alive at the peak
---@field optimizer_state_bytes integer
---@field activations_bytes integer alive at the peak
---@field other_bytes integer the other tensors: `untracked.memory_bytes`

---@class skyline.Attribution
---@field recorded_iterations integer
---@field operations_ms number
---@field user_lines_ms number
---@field user_lines_fraction number?
---@field scaled_by number
---@field mode string `"recorded"` or `"eager_replay"`
---@field untracked_in_steps_fraction number?
---@field between_operations_ms number? the Python between operations at their fastest (CPU)
---@field device_time string? CUDA: `"kernels"` (each operation's kernels' time) or `"spans"`; a busy CPU: `"thread_cpu"`
---@field device_time_fallback string? why spans where kernel time could not be had
