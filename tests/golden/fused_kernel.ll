; ModuleID = 'fused'
source_filename = "fused"

%rt_program = type { i32, i8*, [5 x i64], i32, i32, i32, i32, %rt_tensor*, %rt_tensor*, %rt_tensor*, %rt_tensor*, i32, i32, i32, double, double, void (i8*, i8**)*, [4 x i32], i32, %rt_bucket*, %rt_schedule*, i32, i32, i8*, i32, %rt_cubin*, i32, i8**, i64, i8*, i32, i32, %rt_program** }
%rt_tensor = type { i8*, i32, i64, i32, i32, [5 x i64], i8*, double, i32, i8*, i32, i32 }
%rt_bucket = type { i32, i64, i32, i32*, i64* }
%rt_schedule = type { double, double, double, double }
%rt_cubin = type { i8*, i8*, i64 }

@kiln_stages = private constant [1 x %rt_program*] [%rt_program* @kiln_program]
@.str = private unnamed_addr constant [24 x i8] c"fused_0@fwd L-1 t.lua:4\00"
@.str.1 = private unnamed_addr constant [2 x i8] c"b\00"
@.str.3 = private unnamed_addr constant [2 x i8] c"c\00"
@.str.4 = private unnamed_addr constant [7 x i8] c"normal\00"
@kiln_params = private constant [2 x %rt_tensor] [%rt_tensor { i8* getelementptr inbounds ([2 x i8], [2 x i8]* @.str.1, i32 0, i32 0), i32 0, i64 0, i32 0, i32 3, [5 x i64] [i64 2, i64 3, i64 16, i64 0, i64 0], i8* getelementptr inbounds ([7 x i8], [7 x i8]* @.str.4, i32 0, i32 0), double 1.000000e+00, i32 -1, i8* null, i32 0, i32 1 }, %rt_tensor { i8* getelementptr inbounds ([2 x i8], [2 x i8]* @.str.3, i32 0, i32 0), i32 0, i64 384, i32 0, i32 1, [5 x i64] [i64 16, i64 0, i64 0, i64 0, i64 0], i8* getelementptr inbounds ([7 x i8], [7 x i8]* @.str.4, i32 0, i32 0), double 1.000000e+00, i32 -1, i8* null, i32 0, i32 1 }]
@.str.5 = private unnamed_addr constant [2 x i8] c"a\00"
@kiln_inputs = private constant [1 x %rt_tensor] [%rt_tensor { i8* getelementptr inbounds ([2 x i8], [2 x i8]* @.str.5, i32 0, i32 0), i32 3, i64 0, i32 0, i32 3, [5 x i64] [i64 2, i64 3, i64 16, i64 0, i64 0], i8* null, double 0.000000e+00, i32 -1, i8* null, i32 0, i32 1 }]
@.str.6 = private unnamed_addr constant [2 x i8] c"y\00"
@.str.7 = private unnamed_addr constant [3 x i8] c"ab\00"
@kiln_outputs = private constant [2 x %rt_tensor] [%rt_tensor { i8* getelementptr inbounds ([2 x i8], [2 x i8]* @.str.6, i32 0, i32 0), i32 3, i64 768, i32 0, i32 3, [5 x i64] [i64 2, i64 3, i64 16, i64 0, i64 0], i8* null, double 0.000000e+00, i32 -1, i8* null, i32 0, i32 1 }, %rt_tensor { i8* getelementptr inbounds ([3 x i8], [3 x i8]* @.str.7, i32 0, i32 0), i32 3, i64 384, i32 0, i32 3, [5 x i64] [i64 2, i64 3, i64 16, i64 0, i64 0], i8* null, double 0.000000e+00, i32 -1, i8* null, i32 0, i32 1 }]
@.str.8 = private unnamed_addr constant [6 x i8] c"fused\00"
@kiln_program = constant %rt_program { i32 15, i8* getelementptr inbounds ([6 x i8], [6 x i8]* @.str.8, i32 0, i32 0), [5 x i64] [i64 448, i64 0, i64 0, i64 1152, i64 0], i32 2, i32 0, i32 1, i32 2, %rt_tensor* getelementptr inbounds ([2 x %rt_tensor], [2 x %rt_tensor]* @kiln_params, i32 0, i32 0), %rt_tensor* null, %rt_tensor* getelementptr inbounds ([1 x %rt_tensor], [1 x %rt_tensor]* @kiln_inputs, i32 0, i32 0), %rt_tensor* getelementptr inbounds ([2 x %rt_tensor], [2 x %rt_tensor]* @kiln_outputs, i32 0, i32 0), i32 1, i32 0, i32 0, double 0.000000e+00, double 0.000000e+00, void (i8*, i8**)* @kiln_step, [4 x i32] [i32 1, i32 1, i32 1, i32 1], i32 0, %rt_bucket* null, %rt_schedule* null, i32 0, i32 0, i8* null, i32 0, %rt_cubin* null, i32 0, i8** null, i64 0, i8* null, i32 0, i32 1, %rt_program** getelementptr inbounds ([1 x %rt_program*], [1 x %rt_program*]* @kiln_stages, i32 0, i32 0) }

; Function Attrs: nounwind
declare void @rt_launch(i8*, i32, void (i8*, i64*)*, i64*, i32, i8*) local_unnamed_addr #0

; Function Attrs: nounwind
declare void @rt_parallel_for(i8*, i64, void (i8*, i64, i64)*, i8*) local_unnamed_addr #0

; Function Attrs: mustprogress nofree nosync nounwind readnone speculatable willreturn
declare float @llvm.floor.f32(float) #1

; Function Attrs: mustprogress nofree nosync nounwind readnone speculatable willreturn
declare float @llvm.fabs.f32(float) #1

; Function Attrs: mustprogress nofree nosync nounwind readnone speculatable willreturn
declare float @llvm.copysign.f32(float, float) #1

; Function Attrs: nofree nosync nounwind
define internal void @kiln_fused_0_body(i8* nocapture readonly %0, i64 %1, i64 %2) #2 {
entry:
  %args = bitcast i8* %0 to i64*
  %3 = load i64, i64* %args, align 8
  %4 = inttoptr i64 %3 to float*
  %5 = getelementptr inbounds i8, i8* %0, i64 8
  %6 = bitcast i8* %5 to i64*
  %7 = load i64, i64* %6, align 8
  %8 = inttoptr i64 %7 to float*
  %9 = getelementptr inbounds i8, i8* %0, i64 16
  %10 = bitcast i8* %9 to i64*
  %11 = load i64, i64* %10, align 8
  %12 = inttoptr i64 %11 to float*
  %13 = getelementptr inbounds i8, i8* %0, i64 24
  %14 = bitcast i8* %13 to i64*
  %15 = load i64, i64* %14, align 8
  %16 = inttoptr i64 %15 to float*
  %17 = getelementptr inbounds i8, i8* %0, i64 32
  %18 = bitcast i8* %17 to i64*
  %19 = load i64, i64* %18, align 8
  %20 = inttoptr i64 %19 to float*
  tail call void @llvm.experimental.noalias.scope.decl(metadata !0)
  tail call void @llvm.experimental.noalias.scope.decl(metadata !3)
  tail call void @llvm.experimental.noalias.scope.decl(metadata !5)
  tail call void @llvm.experimental.noalias.scope.decl(metadata !7)
  tail call void @llvm.experimental.noalias.scope.decl(metadata !9)
  %21 = icmp slt i64 %1, %2
  br i1 %21, label %row.i, label %kiln_fused_0_loop.exit

row.i:                                            ; preds = %entry, %next_row.i
  %i.i = phi i64 [ %185, %next_row.i ], [ %1, %entry ]
  %22 = and i64 %i.i, -16
  %c0.i = and i64 %i.i, 15
  %23 = sub nuw i64 %2, %i.i
  %24 = add nuw i64 %c0.i, %23
  %25 = icmp ult i64 %24, 16
  %c1.i = select i1 %25, i64 %24, i64 16
  %26 = add nuw nsw i64 %c0.i, 1
  %umax = call i64 @llvm.umax.i64(i64 %c1.i, i64 %26)
  %27 = sub nsw i64 %umax, %c0.i
  %min.iters.check = icmp ult i64 %27, 4
  br i1 %min.iters.check, label %col.i.preheader, label %vector.ph

vector.ph:                                        ; preds = %row.i
  %n.vec = and i64 %27, -4
  %ind.end = add nsw i64 %c0.i, %n.vec
  br label %vector.body

vector.body:                                      ; preds = %vector.body, %vector.ph
  %index = phi i64 [ 0, %vector.ph ], [ %index.next, %vector.body ]
  %offset.idx = add i64 %c0.i, %index
  %28 = add nuw i64 %offset.idx, %22
  %29 = getelementptr inbounds float, float* %4, i64 %28
  %30 = bitcast float* %29 to <4 x float>*
  %wide.load = load <4 x float>, <4 x float>* %30, align 4, !alias.scope !0, !noalias !11
  %31 = getelementptr inbounds float, float* %8, i64 %28
  %32 = bitcast float* %31 to <4 x float>*
  %wide.load1 = load <4 x float>, <4 x float>* %32, align 4, !alias.scope !3, !noalias !12
  %33 = fmul <4 x float> %wide.load, %wide.load1
  %34 = getelementptr inbounds float, float* %16, i64 %28
  %35 = bitcast float* %34 to <4 x float>*
  store <4 x float> %33, <4 x float>* %35, align 4, !alias.scope !7, !noalias !13
  %36 = getelementptr inbounds float, float* %12, i64 %offset.idx
  %37 = bitcast float* %36 to <4 x float>*
  %wide.load2 = load <4 x float>, <4 x float>* %37, align 4, !alias.scope !5, !noalias !14
  %38 = fadd <4 x float> %33, %wide.load2
  %39 = fmul <4 x float> %38, %38
  %40 = fmul <4 x float> %38, %39
  %41 = fmul <4 x float> %40, <float 0x3FA6E4E260000000, float 0x3FA6E4E260000000, float 0x3FA6E4E260000000, float 0x3FA6E4E260000000>
  %42 = fadd <4 x float> %38, %41
  %43 = fmul <4 x float> %42, <float 0x3FE9884540000000, float 0x3FE9884540000000, float 0x3FE9884540000000, float 0x3FE9884540000000>
  %44 = call <4 x float> @llvm.fabs.v4f32(<4 x float> %43)
  %45 = fmul <4 x float> %43, %43
  %46 = fmul <4 x float> %45, <float 0x3F775E1D40000000, float 0x3F775E1D40000000, float 0x3F775E1D40000000, float 0x3F775E1D40000000>
  %47 = fsub <4 x float> <float 0x3F952269C0000000, float 0x3F952269C0000000, float 0x3F952269C0000000, float 0x3F952269C0000000>, %46
  %48 = fmul <4 x float> %45, %47
  %49 = fadd <4 x float> %48, <float 0xBFAB83C5A0000000, float 0xBFAB83C5A0000000, float 0xBFAB83C5A0000000, float 0xBFAB83C5A0000000>
  %50 = fmul <4 x float> %45, %49
  %51 = fadd <4 x float> %50, <float 0x3FC1107260000000, float 0x3FC1107260000000, float 0x3FC1107260000000, float 0x3FC1107260000000>
  %52 = fmul <4 x float> %45, %51
  %53 = fadd <4 x float> %52, <float 0xBFD5555320000000, float 0xBFD5555320000000, float 0xBFD5555320000000, float 0xBFD5555320000000>
  %54 = fmul <4 x float> %45, %53
  %55 = fmul <4 x float> %43, %54
  %56 = fadd <4 x float> %43, %55
  %57 = fmul <4 x float> %44, <float 2.000000e+00, float 2.000000e+00, float 2.000000e+00, float 2.000000e+00>
  %58 = fcmp uno <4 x float> %57, zeroinitializer
  %59 = select <4 x i1> %58, <4 x float> zeroinitializer, <4 x float> %57
  %60 = fcmp ogt <4 x float> %59, <float 8.900000e+01, float 8.900000e+01, float 8.900000e+01, float 8.900000e+01>
  %61 = select <4 x i1> %60, <4 x float> <float 8.900000e+01, float 8.900000e+01, float 8.900000e+01, float 8.900000e+01>, <4 x float> %59
  %62 = fmul <4 x float> %61, <float 0x3FF7154760000000, float 0x3FF7154760000000, float 0x3FF7154760000000, float 0x3FF7154760000000>
  %63 = fadd <4 x float> %62, <float 5.000000e-01, float 5.000000e-01, float 5.000000e-01, float 5.000000e-01>
  %64 = call <4 x float> @llvm.floor.v4f32(<4 x float> %63)
  %65 = fmul <4 x float> %64, <float 0x3FE6300000000000, float 0x3FE6300000000000, float 0x3FE6300000000000, float 0x3FE6300000000000>
  %66 = fsub <4 x float> %61, %65
  %67 = fmul <4 x float> %64, <float 0x3F2BD01060000000, float 0x3F2BD01060000000, float 0x3F2BD01060000000, float 0x3F2BD01060000000>
  %68 = fadd <4 x float> %67, %66
  %69 = fmul <4 x float> %68, <float 0x3F2A0D2CE0000000, float 0x3F2A0D2CE0000000, float 0x3F2A0D2CE0000000, float 0x3F2A0D2CE0000000>
  %70 = fadd <4 x float> %69, <float 0x3F56E879C0000000, float 0x3F56E879C0000000, float 0x3F56E879C0000000, float 0x3F56E879C0000000>
  %71 = fmul <4 x float> %68, %70
  %72 = fadd <4 x float> %71, <float 0x3F81112100000000, float 0x3F81112100000000, float 0x3F81112100000000, float 0x3F81112100000000>
  %73 = fmul <4 x float> %68, %72
  %74 = fadd <4 x float> %73, <float 0x3FA5553820000000, float 0x3FA5553820000000, float 0x3FA5553820000000, float 0x3FA5553820000000>
  %75 = fmul <4 x float> %68, %74
  %76 = fadd <4 x float> %75, <float 0x3FC5555540000000, float 0x3FC5555540000000, float 0x3FC5555540000000, float 0x3FC5555540000000>
  %77 = fmul <4 x float> %68, %76
  %78 = fadd <4 x float> %77, <float 5.000000e-01, float 5.000000e-01, float 5.000000e-01, float 5.000000e-01>
  %79 = fmul <4 x float> %68, %68
  %80 = fmul <4 x float> %79, %78
  %81 = fadd <4 x float> %68, %80
  %82 = fadd <4 x float> %81, <float 1.000000e+00, float 1.000000e+00, float 1.000000e+00, float 1.000000e+00>
  %83 = fptosi <4 x float> %64 to <4 x i32>
  %84 = ashr <4 x i32> %83, <i32 1, i32 1, i32 1, i32 1>
  %85 = sub <4 x i32> %83, %84
  %86 = shl <4 x i32> %84, <i32 23, i32 23, i32 23, i32 23>
  %87 = add <4 x i32> %86, <i32 1065353216, i32 1065353216, i32 1065353216, i32 1065353216>
  %88 = bitcast <4 x i32> %87 to <4 x float>
  %89 = shl <4 x i32> %85, <i32 23, i32 23, i32 23, i32 23>
  %90 = add <4 x i32> %89, <i32 1065353216, i32 1065353216, i32 1065353216, i32 1065353216>
  %91 = bitcast <4 x i32> %90 to <4 x float>
  %92 = fmul <4 x float> %82, %88
  %93 = fmul <4 x float> %92, %91
  %94 = select <4 x i1> %58, <4 x float> %57, <4 x float> %93
  %95 = fadd <4 x float> %94, <float 1.000000e+00, float 1.000000e+00, float 1.000000e+00, float 1.000000e+00>
  %96 = fdiv <4 x float> <float 2.000000e+00, float 2.000000e+00, float 2.000000e+00, float 2.000000e+00>, %95
  %97 = fsub <4 x float> <float 1.000000e+00, float 1.000000e+00, float 1.000000e+00, float 1.000000e+00>, %96
  %98 = call <4 x float> @llvm.copysign.v4f32(<4 x float> %97, <4 x float> %43)
  %99 = fcmp olt <4 x float> %44, <float 6.250000e-01, float 6.250000e-01, float 6.250000e-01, float 6.250000e-01>
  %100 = select <4 x i1> %99, <4 x float> %56, <4 x float> %98
  %101 = fadd <4 x float> %100, <float 1.000000e+00, float 1.000000e+00, float 1.000000e+00, float 1.000000e+00>
  %102 = fmul <4 x float> %38, <float 5.000000e-01, float 5.000000e-01, float 5.000000e-01, float 5.000000e-01>
  %103 = fmul <4 x float> %102, %101
  %104 = getelementptr inbounds float, float* %20, i64 %28
  %105 = bitcast float* %104 to <4 x float>*
  store <4 x float> %103, <4 x float>* %105, align 4, !alias.scope !9, !noalias !15
  %index.next = add nuw i64 %index, 4
  %106 = icmp eq i64 %index.next, %n.vec
  br i1 %106, label %middle.block, label %vector.body, !llvm.loop !16

middle.block:                                     ; preds = %vector.body
  %cmp.n = icmp eq i64 %27, %n.vec
  br i1 %cmp.n, label %next_row.i, label %col.i.preheader

col.i.preheader:                                  ; preds = %row.i, %middle.block
  %c.i.ph = phi i64 [ %c0.i, %row.i ], [ %ind.end, %middle.block ]
  br label %col.i

col.i:                                            ; preds = %col.i.preheader, %col.i
  %c.i = phi i64 [ %183, %col.i ], [ %c.i.ph, %col.i.preheader ]
  %107 = add nuw i64 %c.i, %22
  %108 = getelementptr inbounds float, float* %4, i64 %107
  %109 = load float, float* %108, align 4, !alias.scope !0, !noalias !11
  %110 = getelementptr inbounds float, float* %8, i64 %107
  %111 = load float, float* %110, align 4, !alias.scope !3, !noalias !12
  %112 = fmul float %109, %111
  %113 = getelementptr inbounds float, float* %16, i64 %107
  store float %112, float* %113, align 4, !alias.scope !7, !noalias !13
  %114 = getelementptr inbounds float, float* %12, i64 %c.i
  %115 = load float, float* %114, align 4, !alias.scope !5, !noalias !14
  %116 = fadd float %112, %115
  %117 = fmul float %116, %116
  %118 = fmul float %116, %117
  %119 = fmul float %118, 0x3FA6E4E260000000
  %120 = fadd float %116, %119
  %121 = fmul float %120, 0x3FE9884540000000
  %122 = tail call float @llvm.fabs.f32(float %121) #0
  %123 = fmul float %121, %121
  %124 = fmul float %123, 0x3F775E1D40000000
  %125 = fsub float 0x3F952269C0000000, %124
  %126 = fmul float %123, %125
  %127 = fadd float %126, 0xBFAB83C5A0000000
  %128 = fmul float %123, %127
  %129 = fadd float %128, 0x3FC1107260000000
  %130 = fmul float %123, %129
  %131 = fadd float %130, 0xBFD5555320000000
  %132 = fmul float %123, %131
  %133 = fmul float %121, %132
  %134 = fadd float %121, %133
  %135 = fmul float %122, 2.000000e+00
  %136 = fcmp uno float %135, 0.000000e+00
  %137 = select i1 %136, float 0.000000e+00, float %135
  %138 = fcmp ogt float %137, 8.900000e+01
  %139 = select i1 %138, float 8.900000e+01, float %137
  %140 = fmul float %139, 0x3FF7154760000000
  %141 = fadd float %140, 5.000000e-01
  %142 = tail call float @llvm.floor.f32(float %141) #0
  %143 = fmul float %142, 0x3FE6300000000000
  %144 = fsub float %139, %143
  %145 = fmul float %142, 0x3F2BD01060000000
  %146 = fadd float %145, %144
  %147 = fmul float %146, 0x3F2A0D2CE0000000
  %148 = fadd float %147, 0x3F56E879C0000000
  %149 = fmul float %146, %148
  %150 = fadd float %149, 0x3F81112100000000
  %151 = fmul float %146, %150
  %152 = fadd float %151, 0x3FA5553820000000
  %153 = fmul float %146, %152
  %154 = fadd float %153, 0x3FC5555540000000
  %155 = fmul float %146, %154
  %156 = fadd float %155, 5.000000e-01
  %157 = fmul float %146, %146
  %158 = fmul float %157, %156
  %159 = fadd float %146, %158
  %160 = fadd float %159, 1.000000e+00
  %161 = fptosi float %142 to i32
  %162 = ashr i32 %161, 1
  %163 = sub i32 %161, %162
  %164 = shl i32 %162, 23
  %165 = add i32 %164, 1065353216
  %166 = bitcast i32 %165 to float
  %167 = shl i32 %163, 23
  %168 = add i32 %167, 1065353216
  %169 = bitcast i32 %168 to float
  %170 = fmul float %160, %166
  %171 = fmul float %170, %169
  %172 = select i1 %136, float %135, float %171
  %173 = fadd float %172, 1.000000e+00
  %174 = fdiv float 2.000000e+00, %173
  %175 = fsub float 1.000000e+00, %174
  %176 = tail call float @llvm.copysign.f32(float %175, float %121) #0
  %177 = fcmp olt float %122, 6.250000e-01
  %178 = select i1 %177, float %134, float %176
  %179 = fadd float %178, 1.000000e+00
  %180 = fmul float %116, 5.000000e-01
  %181 = fmul float %180, %179
  %182 = getelementptr inbounds float, float* %20, i64 %107
  store float %181, float* %182, align 4, !alias.scope !9, !noalias !15
  %183 = add nuw nsw i64 %c.i, 1
  %184 = icmp ult i64 %183, %c1.i
  br i1 %184, label %col.i, label %next_row.i, !llvm.loop !18

next_row.i:                                       ; preds = %col.i, %middle.block
  %185 = add nuw i64 %c1.i, %22
  %186 = icmp slt i64 %185, %2
  br i1 %186, label %row.i, label %kiln_fused_0_loop.exit

kiln_fused_0_loop.exit:                           ; preds = %next_row.i, %entry
  ret void
}

; Function Attrs: nounwind
define internal void @kiln_fused_0(i8* %0, i64* %1) #0 {
entry:
  %2 = getelementptr inbounds i64, i64* %1, i64 5
  %n = load i64, i64* %2, align 8
  %3 = bitcast i64* %1 to i8*
  %4 = icmp slt i64 %n, 16385
  br i1 %4, label %small, label %big

common.ret:                                       ; preds = %big, %small
  ret void

small:                                            ; preds = %entry
  tail call void @kiln_fused_0_body(i8* nonnull %3, i64 0, i64 %n)
  br label %common.ret

big:                                              ; preds = %entry
  tail call void @rt_parallel_for(i8* %0, i64 %n, void (i8*, i64, i64)* nonnull @kiln_fused_0_body, i8* nonnull %3)
  br label %common.ret
}

; Function Attrs: noinline nounwind optnone
define internal void @kiln_step(i8* %0, i8** %1) #3 {
entry:
  %2 = getelementptr inbounds i8*, i8** %1, i64 0
  %3 = load i8*, i8** %2, align 8
  %4 = getelementptr inbounds i8*, i8** %1, i64 1
  %5 = load i8*, i8** %4, align 8
  %6 = getelementptr inbounds i8*, i8** %1, i64 2
  %7 = load i8*, i8** %6, align 8
  %8 = getelementptr inbounds i8*, i8** %1, i64 3
  %9 = load i8*, i8** %8, align 8
  %10 = getelementptr inbounds i8*, i8** %1, i64 4
  %11 = load i8*, i8** %10, align 8
  %args = alloca [32 x i64], align 8
  %12 = getelementptr inbounds i8, i8* %9, i64 0
  %13 = ptrtoint i8* %12 to i64
  %14 = getelementptr inbounds i8, i8* %3, i64 0
  %15 = ptrtoint i8* %14 to i64
  %16 = getelementptr inbounds i8, i8* %3, i64 384
  %17 = ptrtoint i8* %16 to i64
  %18 = getelementptr inbounds i8, i8* %9, i64 384
  %19 = ptrtoint i8* %18 to i64
  %20 = getelementptr inbounds i8, i8* %9, i64 768
  %21 = ptrtoint i8* %20 to i64
  %22 = getelementptr inbounds [32 x i64], [32 x i64]* %args, i64 0, i64 0
  store i64 %13, i64* %22, align 8
  %23 = getelementptr inbounds [32 x i64], [32 x i64]* %args, i64 0, i64 1
  store i64 %15, i64* %23, align 8
  %24 = getelementptr inbounds [32 x i64], [32 x i64]* %args, i64 0, i64 2
  store i64 %17, i64* %24, align 8
  %25 = getelementptr inbounds [32 x i64], [32 x i64]* %args, i64 0, i64 3
  store i64 %19, i64* %25, align 8
  %26 = getelementptr inbounds [32 x i64], [32 x i64]* %args, i64 0, i64 4
  store i64 %21, i64* %26, align 8
  %27 = getelementptr inbounds [32 x i64], [32 x i64]* %args, i64 0, i64 5
  store i64 96, i64* %27, align 8
  %28 = getelementptr inbounds [32 x i64], [32 x i64]* %args, i64 0, i64 0
  call void @rt_launch(i8* %0, i32 0, void (i8*, i64*)* @kiln_fused_0, i64* %28, i32 6, i8* getelementptr inbounds ([24 x i8], [24 x i8]* @.str, i32 0, i32 0))
  ret void
}

; Function Attrs: inaccessiblememonly nofree nosync nounwind willreturn
declare void @llvm.experimental.noalias.scope.decl(metadata) #4

; Function Attrs: nofree nosync nounwind readnone speculatable willreturn
declare i64 @llvm.umax.i64(i64, i64) #5

; Function Attrs: nofree nosync nounwind readnone speculatable willreturn
declare <4 x float> @llvm.fabs.v4f32(<4 x float>) #5

; Function Attrs: nofree nosync nounwind readnone speculatable willreturn
declare <4 x float> @llvm.floor.v4f32(<4 x float>) #5

; Function Attrs: nofree nosync nounwind readnone speculatable willreturn
declare <4 x float> @llvm.copysign.v4f32(<4 x float>, <4 x float>) #5

attributes #0 = { nounwind }
attributes #1 = { mustprogress nofree nosync nounwind readnone speculatable willreturn }
attributes #2 = { nofree nosync nounwind }
attributes #3 = { noinline nounwind optnone }
attributes #4 = { inaccessiblememonly nofree nosync nounwind willreturn }
attributes #5 = { nofree nosync nounwind readnone speculatable willreturn }

!0 = !{!1}
!1 = distinct !{!1, !2, !"kiln_fused_0_loop: argument 0"}
!2 = distinct !{!2, !"kiln_fused_0_loop"}
!3 = !{!4}
!4 = distinct !{!4, !2, !"kiln_fused_0_loop: argument 1"}
!5 = !{!6}
!6 = distinct !{!6, !2, !"kiln_fused_0_loop: argument 2"}
!7 = !{!8}
!8 = distinct !{!8, !2, !"kiln_fused_0_loop: argument 3"}
!9 = !{!10}
!10 = distinct !{!10, !2, !"kiln_fused_0_loop: argument 4"}
!11 = !{!4, !6, !8, !10}
!12 = !{!1, !6, !8, !10}
!13 = !{!1, !4, !6, !10}
!14 = !{!1, !4, !8, !10}
!15 = !{!1, !4, !6, !8}
!16 = distinct !{!16, !17}
!17 = !{!"llvm.loop.isvectorized", i32 1}
!18 = distinct !{!18, !19, !17}
!19 = !{!"llvm.loop.unroll.runtime.disable"}
