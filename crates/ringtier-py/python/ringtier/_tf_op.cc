// ringtier's TensorFlow batch op: a batch of TFRecord records or raw files as one tf.string
// tensor, made here from the loader's memory (one copy per sample, into TensorFlow's strings),
// with the samples' indices, on the tf.data thread that runs it, with no Python and no GIL.
//
// Built by ringtier._tf_op against the installed TensorFlow's headers and linked against
// ringtier's own extension module (already loaded in the process), whose
// ringtier_tf_next_records reads the samples (crates/ringtier-py/src/tf_records.rs). A token
// names the epoch: RecordLoader._tf_epoch or Loader._tf_epoch makes it; an empty tensor marks
// the epoch's end.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

extern "C" {
typedef int (*ringtier_record_sink)(void* ctx, size_t n, const size_t* lens, const int64_t* indices,
                                    uint8_t** out);
int ringtier_tf_next_records(uint64_t token, size_t max_records, ringtier_record_sink sink, void* ctx,
                             char* err, size_t err_cap);
}

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::tstring;

REGISTER_OP("RingtierNextRecords")
    .Input("token: int64")
    .Attr("max_records: int >= 1")
    .Output("records: string")
    .Output("indices: int64")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return Status();
    })
    .Doc("The next batch of a ringtier epoch and its samples' indices (empty at its end).");

// The sink ringtier_tf_next_records calls: the output tensor, each string sized to its
// record, and where to write each.
struct Sink {
  OpKernelContext* ctx;
  Status status;
};

int make_output(void* p, size_t n, const size_t* lens, const int64_t* indices, uint8_t** out) {
  Sink* sink = static_cast<Sink*>(p);
  Tensor* records = nullptr;
  Tensor* index = nullptr;
  Status s = sink->ctx->allocate_output(0, TensorShape({static_cast<int64_t>(n)}), &records);
  if (s.ok()) {
    s = sink->ctx->allocate_output(1, TensorShape({static_cast<int64_t>(n)}), &index);
  }
  if (!s.ok()) {
    sink->status = s;
    return 1;
  }
  auto idx = index->flat<int64_t>();
  for (size_t i = 0; i < n; ++i) {
    idx(i) = indices[i];
  }
  auto flat = records->flat<tstring>();
  for (size_t i = 0; i < n; ++i) {
    flat(i).resize_uninitialized(lens[i]);
    out[i] = reinterpret_cast<uint8_t*>(flat(i).mdata());
  }
  return 0;
}

Status error_of(int code, const std::string& message) {
  switch (code) {
    case -1:
      return tensorflow::errors::InvalidArgument(message);
    case -2:
      return tensorflow::errors::NotFound(message);
    case -3:
      return tensorflow::errors::DataLoss(message);
    case -4:
      return tensorflow::errors::PermissionDenied(message);
    case -5:
      return tensorflow::errors::ResourceExhausted(message);
    case -6:
      return tensorflow::errors::Unavailable(message);
    default:
      return tensorflow::errors::Unknown(message);
  }
}

class RingtierNextRecords : public OpKernel {
 public:
  explicit RingtierNextRecords(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_records", &max_records_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& token = ctx->input(0);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(token.shape()),
                tensorflow::errors::InvalidArgument("token must be a scalar"));
    Sink sink{ctx, Status()};
    std::vector<char> err(4096, '\0');
    int rc = ringtier_tf_next_records(static_cast<uint64_t>(token.scalar<int64_t>()()),
                                      static_cast<size_t>(max_records_), make_output, &sink, err.data(),
                                      err.size());
    if (rc == 0) {
      return;
    }
    if (rc == 1) {
      Tensor* none = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({0}), &none));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({0}), &none));
      return;
    }
    if (rc == 2) {
      OP_REQUIRES_OK(ctx, sink.status);
      return;
    }
    ctx->SetStatus(error_of(rc, std::string(err.data())));
  }

 private:
  int64_t max_records_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("RingtierNextRecords").Device(tensorflow::DEVICE_CPU), RingtierNextRecords);

}  // namespace
