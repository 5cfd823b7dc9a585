#pragma once
// Small hand-written traces shared by the trace viewer's tests.

#include <string>

namespace nerve::trace::samples {

// Two actors, A (id 1, stage 0) and B (id 2, stage 1); times in µs.
//
//   outside ──m0,m1──▶ A: fwd0 [0,10]  fwd1 [10,20]            bwd1 [50,80]
//                            │ send@9      │ send@19              ▲
//                            ▼             ▼                      │ send@49
//                      B:    fwd0 [10,30]  fwd1 [30,50] ──────────┘
//
// Critical path (by hand): A fwd0 -> B fwd0 (message) -> B fwd1 (actor busy: its
// message arrived at 19, B was busy until 30) -> A bwd1 (message); 80 µs long,
// 78 µs in handlers (9 + 20 + 19 + 30), 2 µs in transit.
inline const std::string two_stage = R"json({
  "displayTimeUnit": "ns",
  "traceEvents": [
    {"ph":"M","name":"process_name","pid":0,"tid":0,"args":{"name":"nerve rank 0"}},
    {"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":"A"}},
    {"ph":"M","name":"thread_name","pid":0,"tid":2,"args":{"name":"B"}},
    {"ph":"X","cat":"step","name":"step","pid":0,"tid":0,"ts":0,"dur":80,"args":{"step":0}},
    {"ph":"s","cat":"msg","name":"forward","pid":0,"tid":0,"ts":0,"id":1,"args":{"id":1,"mb":0,"to":1}},
    {"ph":"s","cat":"msg","name":"forward","pid":0,"tid":0,"ts":0,"id":3,"args":{"id":3,"mb":1,"to":1}},
    {"ph":"f","bp":"e","cat":"msg","name":"forward","pid":0,"tid":1,"ts":0,"id":1,"args":{"id":1}},
    {"ph":"X","cat":"handler","name":"forward","pid":0,"tid":1,"ts":0,"dur":10,"args":{"loop":0,"mb":0,"bytes":64,"queue_us":0,"sender":0}},
    {"ph":"s","cat":"msg","name":"forward","pid":0,"tid":1,"ts":9,"id":2,"args":{"id":2,"mb":0,"to":2}},
    {"ph":"f","bp":"e","cat":"msg","name":"forward","pid":0,"tid":1,"ts":10,"id":3,"args":{"id":3}},
    {"ph":"X","cat":"handler","name":"forward","pid":0,"tid":1,"ts":10,"dur":10,"args":{"loop":0,"mb":1,"bytes":64,"queue_us":10,"sender":0}},
    {"ph":"s","cat":"msg","name":"forward","pid":0,"tid":1,"ts":19,"id":4,"args":{"id":4,"mb":1,"to":2}},
    {"ph":"f","bp":"e","cat":"msg","name":"forward","pid":0,"tid":2,"ts":10,"id":2,"args":{"id":2}},
    {"ph":"X","cat":"handler","name":"forward","pid":0,"tid":2,"ts":10,"dur":20,"args":{"loop":1,"mb":0,"bytes":64,"queue_us":1,"sender":1}},
    {"ph":"f","bp":"e","cat":"msg","name":"forward","pid":0,"tid":2,"ts":30,"id":4,"args":{"id":4}},
    {"ph":"X","cat":"handler","name":"forward","pid":0,"tid":2,"ts":30,"dur":20,"args":{"loop":1,"mb":1,"bytes":64,"queue_us":11,"sender":1}},
    {"ph":"s","cat":"msg","name":"backward","pid":0,"tid":2,"ts":49,"id":5,"args":{"id":5,"mb":1,"to":1}},
    {"ph":"f","bp":"e","cat":"msg","name":"backward","pid":0,"tid":1,"ts":50,"id":5,"args":{"id":5}},
    {"ph":"X","cat":"handler","name":"backward","pid":0,"tid":1,"ts":50,"dur":30,"args":{"loop":0,"mb":1,"bytes":64,"queue_us":1,"sender":2}},
    {"ph":"C","cat":"mailbox","name":"mailbox","pid":0,"tid":1,"ts":0,"args":{"depth":2}},
    {"ph":"X","cat":"idle","name":"idle","pid":0,"tid":2000001,"ts":0,"dur":10,"args":{"cause":"input","stage":1}},
    {"ph":"X","cat":"idle","name":"idle","pid":0,"tid":2000001,"ts":60,"dur":20,"args":{"cause":"backpressure","stage":1}},
    {"ph":"X","cat":"idle","name":"idle","pid":0,"tid":2000000,"ts":20,"dur":30,"args":{"cause":"input","stage":0}}
  ],
  "nerve": {
    "version": 1,
    "actors": [{"id":1,"name":"A","loop":0,"stage":0,"group":"net"}, {"id":2,"name":"B","loop":1,"stage":1,"group":"net"}],
    "stages": [{"stage":0,"actors":[1],"loop":0,"device":"cpu"}, {"stage":1,"actors":[2],"loop":1,"device":"cpu"}]
  }
})json";

}  // namespace nerve::trace::samples
