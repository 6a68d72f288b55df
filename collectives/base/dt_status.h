/*
 * dt_status.h — the status code every dtrain function that can fail
 * returns, in every layer.
 *
 * It lives in collectives/base/, the part of the lowest layer that any
 * layer may include without linking anything: the model (which knows
 * nothing of ranks and does not link the collectives) gets this type and
 * nothing else of dt_comm.h. A status says what kind of thing went wrong;
 * the message that says what exactly stays on the handle that failed
 * (dt_comm_error, dt_store_error, dt_model's err, ...).
 */
#ifndef DT_STATUS_H
#define DT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_status {
    DT_OK = 0,
    DT_EINVAL,    /* a bad argument; nothing was sent */
    DT_ETIMEDOUT, /* an op or the rendezvous passed its deadline */
    DT_EPEER,     /* a peer died or its connection failed */
    DT_EPROTO,    /* ranks disagree about an op, or a peer spoke garbage */
    DT_EABORTED,  /* dt_comm_abort was called */
    DT_ESTORE,    /* the rendezvous store is unusable */
    DT_ESYS,      /* a system call failed */
    DT_ENOMEM,
} dt_status;

/* "DT_ETIMEDOUT"; "?" for a value out of range. Defined beside this
 * header, in base/dt_status.c, which dt_collectives links: link it to call
 * this (every layer above the model does). */
const char *dt_status_name(dt_status s);

#ifdef __cplusplus
}
#endif

#endif /* DT_STATUS_H */
